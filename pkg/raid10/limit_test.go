package raid10

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// limitArray returns a served array of 4 memory members.
func limitArray(t testing.TB) *Array {
	t.Helper()
	ms := make([]Member, 4)
	for i := range ms {
		ms[i] = NewMemMember(8 << 20)
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func TestLimitsValidate(t *testing.T) {
	cases := []struct {
		name  string
		l     Limits
		field string // "" : valid
	}{
		{"zero", Limits{}, ""},
		{"all set", Limits{1, 2, 3, 4, 5, 6, 7, 8}, ""},
		{"burst without rate", Limits{ReadIOPSBurst: 5}, ""},
		{"ReadIOPS", Limits{ReadIOPS: -1}, "ReadIOPS"},
		{"ReadIOPSBurst", Limits{ReadIOPS: 1, ReadIOPSBurst: -1}, "ReadIOPSBurst"},
		{"WriteIOPS", Limits{WriteIOPS: -7}, "WriteIOPS"},
		{"WriteIOPSBurst", Limits{WriteIOPSBurst: -1}, "WriteIOPSBurst"},
		{"ReadBytesPerSecond", Limits{ReadBytesPerSecond: -1}, "ReadBytesPerSecond"},
		{"ReadBytesBurst", Limits{ReadBytesBurst: -1}, "ReadBytesBurst"},
		{"WriteBytesPerSecond", Limits{WriteBytesPerSecond: -1}, "WriteBytesPerSecond"},
		{"WriteBytesBurst", Limits{WriteBytesBurst: -1}, "WriteBytesBurst"},
	}
	a := limitArray(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := a.SetLimits(tc.l)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("SetLimits(%+v): %v", tc.l, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "limit "+tc.field+" ") {
				t.Fatalf("SetLimits(%+v) = %v, want ErrInvalid naming %s", tc.l, err, tc.field)
			}
		})
	}
	// A refused setting leaves the one in force.
	want := Limits{1, 2, 3, 4, 5, 6, 7, 8}
	if err := a.SetLimits(want); err != nil {
		t.Fatal(err)
	}
	if err := a.SetLimits(Limits{WriteIOPS: -1}); err == nil {
		t.Fatal("negative WriteIOPS accepted")
	}
	if got := a.Limits(); got != want {
		t.Fatalf("limits after a refused change: %+v, want %+v", got, want)
	}
}

func TestLimitsNormalized(t *testing.T) {
	a := limitArray(t)
	if err := a.SetLimits(Limits{ReadIOPS: 1000, WriteIOPS: 5, WriteBytesPerSecond: 1 << 20, WriteBytesBurst: 4096, ReadBytesBurst: 99}); err != nil {
		t.Fatal(err)
	}
	want := Limits{ReadIOPS: 1000, ReadIOPSBurst: 100, WriteIOPS: 5, WriteIOPSBurst: 1, WriteBytesPerSecond: 1 << 20, WriteBytesBurst: 4096}
	if got := a.Status().Limits; got != want {
		t.Fatalf("Status().Limits = %+v, want %+v (default bursts, a burst without a rate dropped)", got, want)
	}
}

// TestLimitZeroUnlimited: no limits, or limits of the other direction only,
// delay nothing and install nothing on the request path.
func TestLimitZeroUnlimited(t *testing.T) {
	a := limitArray(t)
	if err := a.SetLimits(Limits{ReadIOPS: 10, ReadIOPSBurst: 1}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetLimits(Limits{}); err != nil {
		t.Fatal(err)
	}
	if a.qos.lim.Load() != nil {
		t.Fatal("zero limits left a limiter on the request path")
	}
	p := make([]byte, BlockSize)
	for i := range 200 {
		if _, err := a.ReadAt(p, int64(i)*BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	// Writes limited hard, reads not at all: reads are never delayed.
	if err := a.SetLimits(Limits{WriteIOPS: 1, WriteIOPSBurst: 1, WriteBytesPerSecond: 1}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for i := range 200 {
		if _, err := a.ReadAt(p, int64(i)*BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.Status().Throttle; st != (ThrottleStatus{}) || time.Since(t0) > 5*time.Second {
		t.Fatalf("reads under write-only limits: %+v after %v, want none delayed", st, time.Since(t0))
	}
}

// TestLimitThrottles: requests over a limit wait (they never fail), at the
// rate set, and the waits are counted in Status.
func TestLimitThrottles(t *testing.T) {
	cases := []struct {
		name  string
		l     Limits
		write bool
		size  int
		n     int
		min   time.Duration // the least time the n requests can take
	}{
		// 60 requests, 10 of them in the burst: 50 at 200/s.
		{"read IOPS", Limits{ReadIOPS: 200, ReadIOPSBurst: 10}, false, BlockSize, 60, 250 * time.Millisecond},
		{"write IOPS", Limits{WriteIOPS: 200, WriteIOPSBurst: 10}, true, BlockSize, 60, 250 * time.Millisecond},
		// 2 MiB in 64 KiB requests, 256 KiB of burst, at 8 MiB/s.
		{"read bytes", Limits{ReadBytesPerSecond: 8 << 20, ReadBytesBurst: 256 << 10}, false, 64 << 10, 32, 218 * time.Millisecond},
		{"write bytes", Limits{WriteBytesPerSecond: 8 << 20, WriteBytesBurst: 256 << 10}, true, 64 << 10, 32, 218 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := limitArray(t)
			if err := a.SetLimits(tc.l); err != nil {
				t.Fatal(err)
			}
			p := make([]byte, tc.size)
			// Two submitters: the bucket is shared, its order kept.
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			t0 := time.Now()
			for g := range 2 {
				wg.Go(func() {
					q := bytes.Clone(p)
					for i := g; i < tc.n; i += 2 {
						var err error
						if tc.write {
							_, err = a.WriteAt(q, int64(i*tc.size))
						} else {
							_, err = a.ReadAt(q, int64(i*tc.size))
						}
						if err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(t0)
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if took < tc.min {
				t.Fatalf("%d requests took %v, the limits allow no less than %v", tc.n, took, tc.min)
			}
			st := a.Status().Throttle
			delayed, delay, other := st.ReadsDelayed, st.ReadDelay, st.WritesDelayed
			if tc.write {
				delayed, delay, other = st.WritesDelayed, st.WriteDelay, st.ReadsDelayed
			}
			// How many wait, and how long, depends on how fast the requests
			// run: some did, and only in the limited direction.
			if delayed == 0 || delayed > uint64(tc.n) || delay <= 0 || other != 0 {
				t.Fatalf("throttle counters %+v after %d requests in %v", st, tc.n, took)
			}
			t.Logf("%d requests in %v, %d delayed, %v of delay", tc.n, took, delayed, delay)
		})
	}
}

// TestLimitLiveChange: a change applies to the requests already waiting:
// lifting the limits releases them at once, raising them lets them go
// under the new rate; setting the limits in force again keeps the buckets.
func TestLimitLiveChange(t *testing.T) {
	for _, to := range []Limits{{}, {ReadIOPS: 1e6}} {
		a := limitArray(t)
		if err := a.SetLimits(Limits{ReadIOPS: 1, ReadIOPSBurst: 1}); err != nil {
			t.Fatal(err)
		}
		p := make([]byte, BlockSize)
		if _, err := a.ReadAt(p, 0); err != nil { // the burst
			t.Fatal(err)
		}
		// Each waiter would wait 1 s more than the one before under 1 IOPS.
		var wg sync.WaitGroup
		t0 := time.Now()
		for range 4 {
			wg.Go(func() {
				if _, err := a.ReadAt(make([]byte, BlockSize), 0); err != nil {
					t.Error(err)
				}
			})
		}
		for a.qos.lim.Load().dir[0].ops.tat.Load() < int64(5*time.Second) {
			time.Sleep(time.Millisecond) // until all 4 have reserved
		}
		same := a.qos.lim.Load()
		if err := a.SetLimits(Limits{ReadIOPS: 1, ReadIOPSBurst: 1}); err != nil || a.qos.lim.Load() != same {
			t.Fatalf("setting the limits in force again replaced them (err %v)", err)
		}
		if err := a.SetLimits(to); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if took := time.Since(t0); took > 900*time.Millisecond {
			t.Fatalf("change to %+v: the waiting reads took %v, want them released at the change", to, took)
		}
		if st := a.Status().Throttle; st.ReadsDelayed != 4 {
			t.Fatalf("change to %+v: %d reads counted delayed, want 4", to, st.ReadsDelayed)
		}
	}
}

// TestLimitEngineIO: the engine's own I/O (a scrub, a copy reading its
// source) is not under the volume's limits.
func TestLimitEngineIO(t *testing.T) {
	crawl := Limits{ReadIOPS: 1, ReadIOPSBurst: 1, ReadBytesPerSecond: 4096, ReadBytesBurst: 4096}
	a := limitArray(t)
	if err := a.SetLimits(crawl); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.Check(ctx); err != nil {
		t.Fatalf("scrub under the volume's limits: %v", err)
	}
	rng := rand.New(rand.NewPCG(3, 0x11))
	r := newCopyRig(t, rng, false)
	defer r.src.Close()
	defer r.tgt.Close()
	prefill(t, r.src, rng)
	if err := r.src.SetLimits(crawl); err != nil {
		t.Fatal(err)
	}
	c, err := NewCopy(CopyConfig{Source: r.src, Target: r.tgt, Size: r.src.Size(), Live: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Start()
	if err := c.Wait(ctx); err != nil {
		t.Fatalf("copy from a source under limits: %v", err)
	}
	for _, x := range []*Array{a, r.src} {
		if st := x.Status().Throttle; st != (ThrottleStatus{}) {
			t.Fatalf("the engine's own I/O was throttled: %+v", st)
		}
	}
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	return ok && slices.Contains(bi.Settings, debug.BuildSetting{Key: "-race", Value: "true"})
}

// TestLimitNoAlloc: the limiter costs a request no allocation with no
// limits, under limits far above the load, and when it waits (not checked
// under -race). It counts the limiter's own step (limitRequest), not a whole
// ReadAt: under -race sync.Pool drops a random share of Puts, so the read
// path's pooled buffers allocate now and then (CI saw "none: 1 allocations
// per read" once) whatever the limiter does.
func TestLimitNoAlloc(t *testing.T) {
	a := limitArray(t)
	read := func() { a.limitRequest(false, BlockSize) }
	cases := []struct {
		name string
		l    Limits
	}{
		{"none", Limits{}},
		{"far above", Limits{ReadIOPS: 1e9, ReadBytesPerSecond: 1 << 50}},
		{"waiting", Limits{ReadIOPS: 200, ReadIOPSBurst: 1}},
	}
	for _, tc := range cases {
		if err := a.SetLimits(tc.l); err != nil {
			t.Fatal(err)
		}
		read() // warm the timer pool
		if tc.l.ReadIOPSBurst == 1 && raceEnabled() {
			// The race detector makes sync.Pool drop a random share of Puts.
			continue
		}
		if n := testing.AllocsPerRun(50, read); n != 0 {
			t.Errorf("%s: %v allocations per read", tc.name, n)
		}
	}
	if a.Status().Throttle.ReadsDelayed < 45 && !raceEnabled() {
		t.Fatalf("the waiting case did not wait: %+v", a.Status().Throttle)
	}
}

// stamped is a Completer that sends its request's tag and outcome.
type stamped struct {
	tag  int
	errs chan<- [2]any
}

func (s stamped) Complete(err error) { s.errs <- [2]any{s.tag, err} }

// TestLimitQueue: a Queue's requests are under the limits too, counted once
// per request (one spanning chunks included); a request that waits does not
// hold up the ring's other requests (reads, with only writes limited), a
// change of the limits releases it, and Close waits for it. The data written
// reads back.
func TestLimitQueue(t *testing.T) {
	a, q, _ := newQueueArray(t)
	defer a.Close()
	// Two writes pass in the burst, four wait 1, 2, 3 and 4 s.
	if err := a.SetLimits(Limits{WriteIOPS: 1, WriteIOPSBurst: 2}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(26, 2))
	done := make(chan [2]any, 64)
	var writes [][]byte
	for i := range 6 {
		p := AlignedBuffer(2 * testChunk) // spans two chunks: one request still
		fillRand(rng, p)
		writes = append(writes, p)
		q.Write(p, int64(i)*2*testChunk+testChunk/2, false, stamped{i, done})
	}
	const reads = 16
	for i := range reads {
		q.Read(AlignedBuffer(BlockSize), int64(i)*BlockSize, stamped{100 + i, done})
	}
	if err := q.Submit(); err != nil {
		t.Fatal(err)
	}
	var order []int
	for range reads + 2 { // the reads and the two writes of the burst
		r := <-done
		if r[1] != nil {
			t.Fatalf("request %d: %v", r[0], r[1])
		}
		order = append(order, r[0].(int))
	}
	for _, tag := range order {
		if tag >= 2 && tag < 100 {
			t.Fatalf("completion order %v: a delayed write ended before the reads and the burst", order)
		}
	}
	// Lifting the limits releases the waiting writes; Close waits for them.
	if err := a.SetLimits(Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if len(done) != 4 {
		t.Fatalf("Close returned with %d of the 4 delayed writes completed", len(done))
	}
	for range 4 {
		if r := <-done; r[1] != nil {
			t.Fatalf("request %d: %v", r[0], r[1])
		}
	}
	if st := a.Status().Throttle; st.WritesDelayed != 4 || st.ReadsDelayed != 0 {
		t.Fatalf("throttle counters %+v, want 4 writes delayed, no read", st)
	}
	got := make([]byte, 2*testChunk)
	for i, p := range writes {
		if _, err := a.ReadAt(got, int64(i)*2*testChunk+testChunk/2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, p) {
			t.Fatalf("write %d does not read back", i)
		}
	}
}

// TestLimitQueueFallbackOnce: a Queue request that runs on the synchronous
// path (an unaligned buffer, FUA) is counted once, when the Queue takes it.
func TestLimitQueueFallbackOnce(t *testing.T) {
	a, q, _ := newQueueArray(t)
	defer a.Close()
	if err := a.SetLimits(Limits{WriteIOPS: 1, WriteIOPSBurst: 4, ReadIOPS: 1, ReadIOPSBurst: 2}); err != nil {
		t.Fatal(err)
	}
	done := make(chan [2]any, 8)
	for i := range 4 {
		p := make([]byte, BlockSize+1)[1:] // unaligned: the synchronous path
		q.Write(p, int64(i)*BlockSize, i%2 == 0, stamped{i, done})
	}
	for i := range 2 {
		q.Read(make([]byte, BlockSize+1)[1:], int64(i)*BlockSize, stamped{10 + i, done})
	}
	if err := q.Submit(); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		if r := <-done; r[1] != nil {
			t.Fatalf("request %d: %v", r[0], r[1])
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if _, slow := q.Stats(); slow != 6 {
		t.Fatalf("%d fallbacks, want 6", slow)
	}
	if st := a.Status().Throttle; st != (ThrottleStatus{}) {
		t.Fatalf("requests within the burst were delayed (counted twice?): %+v", st)
	}
}
