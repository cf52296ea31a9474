package raid10

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const largeChunk = 512 << 10 // md's default chunk, DefaultChunkSize

// newLargeRig is a 4-member array of FaultyMembers over memory with 512 KiB
// chunks, filled with random data (the model).
func newLargeRig(t *testing.T) (*Array, []*FaultyMember, []byte) {
	t.Helper()
	var fs []*FaultyMember
	var ms []Member
	for range 4 {
		f := NewFaultyMember(NewMemMember(8 << 20))
		fs = append(fs, f)
		ms = append(ms, f)
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: largeChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	model := make([]byte, a.Size())
	fillRand(rand.New(rand.NewPCG(7, 8)), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	return a, fs, model
}

func readOps(a *Array) []uint64 {
	var ops []uint64
	for _, m := range a.Status().Members {
		ops = append(ops, m.ReadOps)
	}
	return ops
}

// TestLargeReadUsesEveryMember: on an idle 4-member array a 1 MiB read over
// two 512 KiB chunks reads both at once, one member call each (md's cost);
// consecutive 1 MiB reads of a stream take the other copies, so two of them
// have used all four members; a read of 256 KiB within one chunk takes both
// of its copies; a 4 KiB or 64 KiB read stays one call on one member. Every
// read returns the data.
func TestLargeReadUsesEveryMember(t *testing.T) {
	a, _, model := newLargeRig(t)
	seen := make([]uint64, 4)
	for _, tc := range []struct {
		name    string
		off, n  int64
		members int // members with one read call each; the others none
	}{
		{"1 MiB over two chunks", 0, 1 << 20, 2},
		{"the next 1 MiB", 2 * largeChunk, 1 << 20, 2},
		{"2 MiB over four chunks", 4 * largeChunk, 2 << 20, 4},
		{"256 KiB within a chunk", 8*largeChunk + 128<<10, 256 << 10, 2},
		{"4 KiB", 9*largeChunk + 4096, 4096, 1},
		{"64 KiB", 9 * largeChunk, 64 << 10, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := readOps(a)
			p := make([]byte, tc.n)
			if n, err := a.ReadAt(p, tc.off); err != nil || n != len(p) {
				t.Fatalf("ReadAt: %d, %v", n, err)
			}
			if !bytes.Equal(p, model[tc.off:tc.off+tc.n]) {
				t.Fatal("data differs from what was written")
			}
			after := readOps(a)
			used, calls := 0, uint64(0)
			for i := range after {
				d := after[i] - before[i]
				calls += d
				if d > 0 {
					used++
				}
			}
			if used != tc.members || calls != uint64(tc.members) {
				t.Fatalf("read made %d calls on %d members (%v -> %v), want one call on each of %d", calls, used, before, after, tc.members)
			}
			for i := range after {
				seen[i] += after[i] - before[i]
			}
			if tc.name == "the next 1 MiB" {
				for i, n := range seen {
					if n == 0 {
						t.Fatalf("two consecutive 1 MiB reads left member %d unused: %v", i, seen)
					}
				}
			}
		})
	}
}

// TestLargeReadPlanInQueue: with other large reads in flight too, a 1 MiB
// read is one part per chunk (md's member calls), and consecutive reads of a
// stream take alternate copies, so the stream reads from every member.
func TestLargeReadPlanInQueue(t *testing.T) {
	a, _, _ := newLargeRig(t)
	p := make([]byte, 1<<20)
	used := map[int]int{}
	for off := int64(0); off < 4<<20; off += 1 << 20 {
		var parts [maxReadParts]readPart
		n, next := a.planRead(&parts, p, off, 0, false)
		if n != 2 || next != len(p) {
			t.Fatalf("read at %d: %d parts covering %d bytes, want 2 covering %d", off, n, next, len(p))
		}
		for _, pt := range parts[:n] {
			d0, d1, _, _ := a.geo.mapChunk(pt.aoff >> a.geo.chunkShift)
			m := []int{d0, d1}[pt.want]
			used[m]++
		}
	}
	if len(used) != 4 || used[0] != used[1] || used[1] != used[2] || used[2] != used[3] {
		t.Fatalf("parts per member %v, want all 4 members equally", used)
	}
}

// TestLargeReadFaults: a large read whose halves meet a failed copy, a read
// error or a failed member still returns the data (from the other copy), and
// the read error is healed there.
func TestLargeReadFaults(t *testing.T) {
	t.Run("read error on a halved read", func(t *testing.T) {
		a, fs, model := newLargeRig(t)
		// A 256 KiB read within chunk 0 (members 0 and 1) reads its second half from member 1.
		_, _, _, o1 := a.geo.mapChunk(0)
		fs[1].FailRange(o1+128<<10, 4096, true, false)
		p := make([]byte, 256<<10)
		if _, err := a.ReadAt(p, 0); err != nil {
			t.Fatalf("ReadAt: %v", err)
		}
		if !bytes.Equal(p, model[:256<<10]) {
			t.Fatal("data differs from what was written")
		}
		if st := a.Status(); st.Members[1].ReadErrors == 0 || st.State != ArrayOptimal {
			t.Fatalf("status %v, member 1 read errors %d", st.State, st.Members[1].ReadErrors)
		}
	})
	t.Run("read error on one part", func(t *testing.T) {
		a, fs, model := newLargeRig(t)
		// Chunk 2 is on members 0 and 1, in row 1: a 1 MiB read takes it from member 1.
		d0, d1, _, o1 := a.geo.mapChunk(2)
		if d0 != 0 || d1 != 1 {
			t.Fatalf("chunk 2 on %d,%d", d0, d1)
		}
		fs[1].FailRange(o1+largeChunk/2, 64<<10, true, false)
		p := make([]byte, 1<<20)
		if _, err := a.ReadAt(p, 2*largeChunk); err != nil {
			t.Fatalf("ReadAt: %v", err)
		}
		if !bytes.Equal(p, model[2*largeChunk:2*largeChunk+1<<20]) {
			t.Fatal("data differs from what was written")
		}
		if st := a.Status(); st.Members[1].ReadErrors == 0 || st.State != ArrayOptimal {
			t.Fatalf("status %v, member 1 read errors %d", st.State, st.Members[1].ReadErrors)
		}
	})
	t.Run("member failed", func(t *testing.T) {
		a, _, model := newLargeRig(t)
		if err := a.FailMember(3); err != nil {
			t.Fatal(err)
		}
		before := readOps(a)
		p := make([]byte, 1<<20)
		if _, err := a.ReadAt(p, 2*largeChunk); err != nil {
			t.Fatalf("ReadAt: %v", err)
		}
		if !bytes.Equal(p, model[2*largeChunk:2*largeChunk+1<<20]) {
			t.Fatal("data differs from what was written")
		}
		if after := readOps(a); after[3] != before[3] {
			t.Fatalf("the failed member was read: %v -> %v", before, after)
		}
	})
	t.Run("member fails between plan and read", func(t *testing.T) {
		a, fs, model := newLargeRig(t)
		fs[1].FailReadsAfter(0) // every read of member 1 fails: it is failed on the first
		p := make([]byte, 2<<20)
		for off := int64(0); off+int64(len(p)) <= a.Size(); off += int64(len(p)) {
			if _, err := a.ReadAt(p, off); err != nil {
				t.Fatalf("ReadAt %d: %v", off, err)
			}
			if !bytes.Equal(p, model[off:off+int64(len(p))]) {
				t.Fatalf("data at %d differs from what was written", off)
			}
		}
	})
	t.Run("both copies unreadable is EIO", func(t *testing.T) {
		a, fs, _ := newLargeRig(t)
		_, _, o0, o1 := a.geo.mapChunk(3)
		fs[2].FailRange(o0, BlockSize, true, true)
		fs[3].FailRange(o1, BlockSize, true, true)
		p := make([]byte, 1<<20)
		_, err := a.ReadAt(p, 2*largeChunk)
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("ReadAt: %v, want EIO", err)
		}
	})
}

// BenchmarkSeqRead1M reads 1 MiB at a time, in order, from one submitter
// (a queue-depth-1 stream: each read's two chunk parts run at once, and
// consecutive reads alternate copies), on the benchmark array of 4 file
// members (bench_test.go); ref is
// pread of 1 MiB from one of its files. x-ref is the throughput relative to
// ref; -benchmem shows the read path allocates nothing.
func BenchmarkSeqRead1M(b *testing.B) {
	for _, media := range []string{"tmpfs", "disk"} {
		b.Run(media, func(b *testing.B) {
			e := benchSetup(b, media)
			p := AlignedBuffer(1 << 20)
			var refNs float64
			for _, target := range []string{"ref", "raid10"} {
				b.Run(target, func(b *testing.B) {
					read, size := e.arr.ReadAt, e.arr.Size()
					if target == "ref" {
						read, size = e.files[0].ReadAt, e.files[0].Size()
					}
					b.ReportAllocs()
					b.SetBytes(int64(len(p)))
					b.ResetTimer()
					start := time.Now()
					off := int64(0)
					for range b.N {
						if off+int64(len(p)) > size {
							off = 0
						}
						if _, err := read(p, off); err != nil {
							b.Fatal(err)
						}
						off += int64(len(p))
					}
					ns := float64(time.Since(start).Nanoseconds()) / float64(b.N)
					if target == "ref" {
						refNs = ns
					} else if refNs > 0 {
						b.ReportMetric(refNs/ns, "x-ref")
					}
				})
			}
		})
	}
}

// watchdog runs fn and waits for it. If fn has not returned after a
// minute (it takes milliseconds), it reports the engine's goroutines, calls
// unstick (which must let fn end) and fails the test: a hang fails the test
// with its stacks instead of stopping the whole binary at the test timeout.
func watchdog(t *testing.T, what string, fn func(), unstick func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return
	case <-time.After(time.Minute):
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var stuck []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "raid10.(*Array)") {
			stuck = append(stuck, g)
		}
	}
	unstick()
	<-done
	t.Fatalf("%s: stuck; the engine's goroutines:\n%s", what, strings.Join(stuck, "\n\n"))
}

// TestHandOffWhileWorkersWaitOnBarrier: a goroutine raises a chunk's
// barrier, the parts of large reads of that chunk take every worker and wait
// there for the barrier, and the barrier's holder then reads a member
// through a worker, as a resync's or a read fix-up's member call does under
// a slow member (rescuedIO). The call must get a worker of its own: queued
// behind the waiting parts (a submitter counting a worker idle that was
// already handed a part), it stops the array (soak seed
// 1796086838133209456). With one P the submitter runs on until it waits,
// so every part is handed off before any worker runs: a call without a
// worker of its own hangs every time.
func TestHandOffWhileWorkersWaitOnBarrier(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var ms []Member
	for range 2 {
		ms = append(ms, NewMemMember(4<<20))
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: 4096, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	model := make([]byte, 4096)
	fillRand(rand.New(rand.NewPCG(1, 2)), model)
	const c = 5
	if _, err := a.WriteAt(model, c*4096); err != nil {
		t.Fatal(err)
	}
	nw := a.nWorkers.Load()
	waitFor(t, "every worker waiting for a request", func() bool { return a.spare.Load() == nw })

	bk := a.raise(c)
	var lowerOnce sync.Once
	lowerBarrier := func() { lowerOnce.Do(func() { a.lower(bk) }) }
	var parts []*wreq
	var holderErr error
	got := make([]byte, 4096)
	watchdog(t, "a member call of a barrier's holder", func() {
		// The parts of large reads of chunk c, handed off as runParts does.
		for range nw {
			req := a.reqs.pop()
			req.op, req.p, req.off, req.want = opReadPiece, make([]byte, 4096), c*4096, copyAny
			a.submit(req)
			parts = append(parts, req)
		}
		// The holder's member call.
		_, _, o0, _ := a.geo.mapChunk(c)
		s := a.slots[0]
		err, ok := a.handedOff(s, s.live(), opRead, got, o0, 4096, false)
		if !ok {
			err = fmt.Errorf("no free request for the holder's call")
		}
		holderErr = err
		lowerBarrier()
	}, lowerBarrier)
	if holderErr != nil {
		t.Fatalf("the holder's member read: %v", holderErr)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("the holder's member read returned other data")
	}
	for i, req := range parts {
		<-req.done
		if req.err != nil || !bytes.Equal(req.p, model) {
			t.Fatalf("part %d: err %v, data equal %v", i, req.err, bytes.Equal(req.p, model))
		}
		a.recycle(req)
	}
	if n := a.nWorkers.Load(); n > int64(cap(a.work)) {
		t.Fatalf("%d workers for %d requests", n, cap(a.work))
	}
}
