package raid10

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The limiter's benchmarks, not timed pass/fail tests: each reports ratios
// measured in the same run. Run with
//
//	go test -run '^$' -bench 'Limit' -benchtime 1x ./pkg/raid10/
//
// BenchmarkLimitAccuracy loads an array of memory members from 8
// submitters (ReadAt/WriteAt), or one of O_DIRECT files through a Queue (32
// requests in flight), measures the rate it reaches unlimited, sets a limit
// of half that, at most 10,000 IOPS or 100 MiB/s (with the default burst),
// while the load runs, waits for the burst to drain, and reports
//
//	rate/limit   the requests (or bytes) completed per second over a
//	             1.5 s window that starts with the bucket empty, divided by
//	             the limit (target 0.95-1.05); a window in which the bucket
//	             held 20 ms of tokens or more or the process stood still
//	             for 50 ms (the load fell behind: a busy machine; the bucket
//	             may have lost tokens past its burst) is measured again, 5 at most (the last one is
//	             reported, with a line in the log)
//	windows      the windows measured
//	limit        the limit, requests or bytes per second
//
// BenchmarkLimitOverhead reads 4 KiB from memory members (mem: the engine's
// own cost) and O_DIRECT files on tmpfs (file), from 1 and 8 submitters, in
// rounds that alternate no limits and limits far above the load (1e9 IOPS,
// 1 PiB/s), and reports the medians over 101 pairs of short rounds of
//
//	ns/op-none   ns/op without limits
//	ns/op-added  ns/op with limits - ns/op without, in the same pair
//	x-none       ns/op with limits / ns/op without, in the same pair (1.00:
//	             no cost)

// limitLoad is a load kept running on an array until stop.
type limitLoad struct {
	ops, bytes atomic.Int64
	stop       atomic.Bool
	wg         sync.WaitGroup
	err        atomic.Pointer[error]
}

func (l *limitLoad) fail(err error) {
	l.err.CompareAndSwap(nil, &err)
	l.stop.Store(true)
}

// syncLoad runs 8 submitters of size-byte requests through ReadAt or WriteAt.
func syncLoad(a *Array, write bool, size int) *limitLoad {
	l := &limitLoad{}
	span := a.Size() / int64(size)
	for g := range 8 {
		l.wg.Go(func() {
			p := AlignedBuffer(size)
			for i := int64(g); !l.stop.Load(); i += 8 {
				off := i % span * int64(size)
				var err error
				if write {
					_, err = a.WriteAt(p, off)
				} else {
					_, err = a.ReadAt(p, off)
				}
				if err != nil {
					l.fail(err)
					return
				}
				l.ops.Add(1)
				l.bytes.Add(int64(size))
			}
		})
	}
	return l
}

// benchDone is a request of queueLoad: its completion sends it back.
type benchDone struct {
	p    []byte
	back chan *benchDone
	err  error
}

func (d *benchDone) Complete(err error) { d.err = err; d.back <- d }

// queueLoad keeps 32 size-byte requests in flight through one Queue.
func queueLoad(q *Queue, a *Array, write bool, size int) *limitLoad {
	l := &limitLoad{}
	span := a.Size() / int64(size)
	l.wg.Go(func() {
		back := make(chan *benchDone, 32)
		next := int64(0)
		issue := func(d *benchDone) {
			off := next % span * int64(size)
			next++
			if write {
				q.Write(d.p, off, false, d)
			} else {
				q.Read(d.p, off, d)
			}
		}
		for range 32 {
			issue(&benchDone{p: AlignedBuffer(size), back: back})
		}
		inflight := 32
		for inflight > 0 {
			if err := q.Submit(); err != nil {
				l.fail(err)
			}
			d := <-back
			inflight--
			if d.err != nil {
				l.fail(d.err)
			}
			l.ops.Add(1)
			l.bytes.Add(int64(size))
			if !l.stop.Load() {
				issue(d)
				inflight++
			}
		}
	})
	return l
}

// rateOver returns the rate of ops (or bytes) of l over window, after warm.
func rateOver(l *limitLoad, bytes bool, warm, window time.Duration) float64 {
	count := func() int64 {
		if bytes {
			return l.bytes.Load()
		}
		return l.ops.Load()
	}
	time.Sleep(warm)
	c0, t0 := count(), time.Now()
	time.Sleep(window)
	c1, t1 := count(), time.Now()
	return float64(c1-c0) / t1.Sub(t0).Seconds()
}

func BenchmarkLimitAccuracy(b *testing.B) {
	cases := []struct {
		name  string
		queue bool
		write bool
		size  int
		bytes bool // a bandwidth limit, else IOPS
	}{
		{"sync/read-iops", false, false, BlockSize, false},
		{"sync/write-iops", false, true, BlockSize, false},
		{"sync/read-bytes", false, false, 64 << 10, true},
		{"sync/write-bytes", false, true, 64 << 10, true},
		{"queue/read-iops", true, false, BlockSize, false},
		{"queue/write-iops", true, true, BlockSize, false},
		{"queue/read-bytes", true, false, 64 << 10, true},
		{"queue/write-bytes", true, true, 64 << 10, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			var a *Array
			var q *Queue
			var l *limitLoad
			if tc.queue {
				a, q = benchQueueArray(b)
				l = queueLoad(q, a, tc.write, tc.size)
			} else {
				a = limitArray(b)
				l = syncLoad(a, tc.write, tc.size)
			}
			// The load ends before the array (and its Queue, which only the
			// load's goroutine may use) closes, however the benchmark ends.
			stop := func() {
				l.stop.Store(true)
				// Lift the limits so the requests still waiting end at once.
				_ = a.SetLimits(Limits{})
				l.wg.Wait()
				if q != nil {
					_ = q.Close()
				}
			}
			defer stop()
			// The limit is half of what the load reaches unlimited (at most
			// 10,000 IOPS or 100 MiB/s, limits a volume is given), so the load
			// stays far above it.
			capacity := rateOver(l, tc.bytes, 100*time.Millisecond, 400*time.Millisecond)
			limit := int64(min(capacity/2, 10000))
			if tc.bytes {
				limit = int64(min(capacity/2, 100<<20))
			}
			if limit == 0 {
				b.Fatalf("the load did not run: %v", l.err.Load())
			}
			lim := limitOf(tc.write, tc.bytes, limit)
			if err := a.SetLimits(lim); err != nil {
				b.Fatal(err)
			}
			// A load that falls behind (a machine too busy to run it) leaves
			// tokens, and its rate says nothing of the limiter: such a window
			// is measured again.
			var got float64
			windows, ok := 0, false
			for ; !ok && windows < 5; windows++ {
				got, ok = limitedRate(l, a, tc.write, tc.bytes, 1500*time.Millisecond)
			}
			stop()
			if p := l.err.Load(); p != nil {
				b.Fatal(*p)
			}
			if !ok {
				b.Logf("the load fell below the limit %+v in 5 windows: the machine is too busy for this figure", lim)
			}
			b.ReportMetric(got/float64(limit), "rate/limit")
			b.ReportMetric(float64(limit), "limit")
			b.ReportMetric(float64(windows), "windows")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// limitOf returns Limits with the one limit given.
func limitOf(write, bytes bool, limit int64) Limits {
	switch {
	case bytes && write:
		return Limits{WriteBytesPerSecond: limit}
	case bytes:
		return Limits{ReadBytesPerSecond: limit}
	case write:
		return Limits{WriteIOPS: limit}
	}
	return Limits{ReadIOPS: limit}
}

// limitedRate returns the rate of l over window, which starts once the
// bucket holds less than 1 ms of tokens (the load took the burst and every
// token since), and whether it held less than 20 ms all along (the load
// kept above the limit) and the process ran all along.
func limitedRate(l *limitLoad, a *Array, write, bytes bool, window time.Duration) (float64, bool) {
	count := func() int64 {
		if bytes {
			return l.bytes.Load()
		}
		return l.ops.Load()
	}
	for t0 := time.Now(); tokensLeft(a, write, bytes) > time.Millisecond; time.Sleep(time.Millisecond) {
		if time.Since(t0) > 3*time.Second {
			return 0, false
		}
	}
	ok := true
	c0, t0 := count(), time.Now()
	for last := t0; time.Since(t0) < window; {
		time.Sleep(5 * time.Millisecond)
		// Under 20 ms of tokens at each sample and under 50 ms between two:
		// the bucket never reached its burst (100 ms), so no token was lost
		// while the process stood still (a busy host).
		ok = ok && tokensLeft(a, write, bytes) < 20*time.Millisecond && time.Since(last) < 50*time.Millisecond
		last = time.Now()
	}
	c1, t1 := count(), time.Now()
	return float64(c1-c0) / t1.Sub(t0).Seconds(), ok
}

// tokensLeft returns the tokens the limited bucket of a's limiter holds,
// in time at its rate.
func tokensLeft(a *Array, write, bytes bool) time.Duration {
	lm := a.qos.lim.Load()
	dir := &lm.dir[0]
	if write {
		dir = &lm.dir[1]
	}
	bk := &dir.ops
	if bytes {
		bk = &dir.bytes
	}
	return time.Duration(max(0, int64(time.Since(lm.base))-(bk.tat.Load()-bk.burst)))
}

// fileArray returns an array of 4 O_DIRECT file members, on tmpfs where it
// takes O_DIRECT (Linux 6.6+): the disk's flushes would make a load's rate
// swing.
func fileArray(b *testing.B) *Array {
	if dir, err := os.MkdirTemp("/dev/shm", "raid10-limit-"); err == nil {
		b.Setenv("TMPDIR", dir)
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	ms := fileMembers(b, 4, 32<<20)
	if !ms[0].(*FileMember).Direct() {
		b.Skip("no O_DIRECT in the test directory: the ring path would not run")
	}
	opts := testOpts()
	opts.BitmapClearDelay = time.Minute // no bitmap flushes in the window
	a, err := Create(ms, CreateOptions{Options: opts, ChunkSize: testChunk, AssumeClean: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

// benchQueueArray is fileArray with a Queue of depth 32.
func benchQueueArray(b *testing.B) (*Array, *Queue) {
	a := fileArray(b)
	q, err := a.NewQueue(32)
	if errors.Is(err, ErrNoRing) {
		b.Skipf("no io_uring here: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	return a, q
}

func BenchmarkLimitOverhead(b *testing.B) {
	for _, media := range []string{"mem", "file"} {
		for _, par := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/qd%d", media, par), func(b *testing.B) {
				benchOverhead(b, media, par)
			})
		}
	}
}

// benchOverhead is one case of BenchmarkLimitOverhead: par submitters.
func benchOverhead(b *testing.B, media string, par int) {
	var a *Array
	if media == "file" {
		a = fileArray(b)
	} else {
		a = limitArray(b)
	}
	far := Limits{ReadIOPS: 1e9, ReadBytesPerSecond: 1 << 50}
	ops := 20000 // a round of a few ms: many short pairs ride out the machine's load swings
	if media == "file" {
		ops = 2000
	}
	p := AlignedBuffer(par * BlockSize)
	round := func() float64 {
		var wg sync.WaitGroup
		t0 := time.Now()
		for g := range par {
			wg.Go(func() {
				q := p[g*BlockSize : (g+1)*BlockSize]
				for i := g; i < ops; i += par {
					if _, err := a.ReadAt(q, int64(i%512)*BlockSize); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return float64(time.Since(t0).Nanoseconds()) / float64(ops)
	}
	round() // warm up
	// Rounds in pairs, each pair's ratio against the same moment's load;
	// every other pair runs the limited round first.
	var none, added, ratio []float64
	set := func(l Limits) {
		if err := a.SetLimits(l); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 101 {
		var n, l float64
		if i%2 == 0 {
			set(Limits{})
			n = round()
			set(far)
			l = round()
		} else {
			set(far)
			l = round()
			set(Limits{})
			n = round()
		}
		none, added, ratio = append(none, n), append(added, l-n), append(ratio, l/n)
	}
	if st := a.Status().Throttle; st.ReadsDelayed != 0 {
		b.Fatalf("limits far above the load delayed %d reads", st.ReadsDelayed)
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(median(none), "ns/op-none")
	b.ReportMetric(median(added), "ns/op-added")
	b.ReportMetric(median(ratio), "x-none")
	b.ReportMetric(0, "ns/op")
}
