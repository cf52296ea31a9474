package raid10

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testSeed returns RAID10_SEED if set, else a fresh seed; it is logged so a
// failure can be replayed with RAID10_SEED=<seed>.
func testSeed(t *testing.T) uint64 {
	if s := os.Getenv("RAID10_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// runSeeds runs round as one subtest per seed: RAID10_SEED=<seed> replays
// one; RAID10_SOAK=<duration> runs fresh seeds for that long, until one
// fails; otherwise the fixed set i*0x9e3779b97f4a7c15+add for i = 1..n
// (n/2 with -short).
func runSeeds(t *testing.T, n int, add uint64, round func(t *testing.T, seed uint64)) {
	var seeds []uint64
	switch {
	case os.Getenv("RAID10_SEED") != "":
		seeds = []uint64{testSeed(t)}
	case os.Getenv("RAID10_SOAK") != "":
		d, err := time.ParseDuration(os.Getenv("RAID10_SOAK"))
		if err != nil {
			t.Fatalf("RAID10_SOAK: %v", err)
		}
		end := time.Now().Add(d)
		base := uint64(time.Now().UnixNano())
		for i := uint64(0); time.Now().Before(end); i++ {
			s := base + i
			if !t.Run(fmt.Sprint(s), func(t *testing.T) { round(t, s) }) {
				break
			}
		}
	default:
		if testing.Short() {
			n /= 2
		}
		for i := 1; i <= n; i++ {
			seeds = append(seeds, uint64(i)*0x9e3779b97f4a7c15+add)
		}
	}
	for _, s := range seeds {
		t.Run(fmt.Sprint(s), func(t *testing.T) { round(t, s) })
	}
}

// TestModel drives the array from many goroutines against an in-memory
// reference while a chaos goroutine fails members (injected write or read
// errors, FailMember, disappearing), brings them back (bitmap re-add) or
// replaces them (full recovery). Each worker owns a section of the array, so
// every read can be checked at once. At the end the array is brought back to
// optimal, the data must equal the model, a scrub must find no mismatch,
// and the same holds after Close and Assemble.
func TestModel(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (replay with RAID10_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	n := 2 + rng.IntN(4)
	const memberSize = 4 << 20
	chunk := int64(BlockSize) << rng.IntN(4) // 4..32 KiB: many chunks
	dur := 2 * time.Second
	if testing.Short() {
		dur = time.Second
	}
	bases := make([]*MemMember, n)
	fs := make([]*FaultyMember, n)
	ms := make([]Member, n)
	for i := range ms {
		bases[i] = NewMemMember(memberSize)
		fs[i] = NewFaultyMember(bases[i])
		ms[i] = fs[i]
	}
	assumeClean := rng.IntN(2) == 0
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: chunk, RegionSize: chunk * 4, AssumeClean: assumeClean})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("members %d, chunk %d, size %d, assumeClean %v", n, chunk, a.Size(), assumeClean)
	model := make([]byte, a.Size())

	const workers = 6
	section := a.Size() / workers / BlockSize * BlockSize
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, workers+1)
	var ops atomic.Int64
	for w := 0; w < workers; w++ {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := int64(w) * section
			buf := make([]byte, 64*BlockSize)
			for !stop.Load() {
				off := base + wrng.Int64N(section/BlockSize)*BlockSize
				l := min(base+section-off, (1+wrng.Int64N(16))*BlockSize)
				if wrng.IntN(8) == 0 {
					l = min(base+section-off, (1+wrng.Int64N(64))*BlockSize) // crosses chunks
				}
				p := buf[:l]
				var err error
				switch op := wrng.IntN(20); {
				case op < 9:
					fillRand(wrng, p)
					if wrng.IntN(10) == 0 {
						_, err = a.WriteAtFUA(p, off)
					} else {
						_, err = a.WriteAt(p, off)
					}
					if err == nil {
						copy(model[off:], p)
					}
				case op < 17:
					_, err = a.ReadAt(p, off)
					if err == nil && !bytes.Equal(p, model[off:off+l]) {
						err = fmt.Errorf("read [%d,+%d) differs from the model", off, l)
					}
				case op < 18:
					err = a.Flush()
				case op < 19:
					err = a.Discard(off, l)
					if err == nil {
						clear(model[off : off+l])
					}
				default:
					err = a.WriteZeroes(off, l)
					if err == nil {
						clear(model[off : off+l])
					}
				}
				if err != nil {
					errc <- fmt.Errorf("worker %d: %w (status %+v)", w, err, a.Status())
					stop.Store(true)
					return
				}
				ops.Add(1)
			}
		}()
	}

	// Chaos: at most one member out at a time, so every chunk keeps a copy.
	ctx := context.Background()
	deadline := time.Now().Add(dur)
	events := map[string]int{}
	for time.Now().Before(deadline) && !stop.Load() {
		time.Sleep(time.Duration(5+rng.IntN(30)) * time.Millisecond)
		if err := a.WaitSync(ctx); err != nil {
			t.Fatal(err)
		}
		i := rng.IntN(n)
		f := fs[i]
		kind := rng.IntN(5)
		switch kind {
		case 0: // write errors
			f.FailWritesAfter(int64(rng.IntN(20)))
			events["write-fault"]++
		case 1: // read errors: fixed by rewrites, the member stays
			f.FailRange(a.geo.dataOffset+rng.Int64N(a.geo.dataSize/BlockSize)*BlockSize, 16*BlockSize, true, false)
			events["read-fault"]++
		case 2:
			if err := a.FailMember(i); err != nil {
				t.Fatal(err)
			}
			events["fail"]++
		case 3:
			f.Disappear()
			events["disappear"]++
		case 4:
			f.SetLatency(time.Duration(rng.IntN(200)) * time.Microsecond)
			events["latency"]++
		}
		time.Sleep(time.Duration(5+rng.IntN(30)) * time.Millisecond)
		f.ClearFaults()
		f.Reappear()
		f.SetLatency(0)
		if kind == 3 || kind == 0 {
			// Make sure the member is out before it comes back.
			_ = a.FailMember(i)
		}
		if MemberState(a.slots[i].state.Load()) == MemberFaulty {
			if rng.IntN(3) == 0 {
				// Replace with a blank member: full recovery.
				bases[i] = NewMemMember(memberSize)
				fs[i] = NewFaultyMember(bases[i])
				if err := a.ReplaceMember(i, fs[i]); err != nil {
					t.Fatal(err)
				}
				events["replace"]++
			} else {
				// Re-add the same member: bitmap-based recovery.
				// ErrBusy while a call abandoned when it failed is
				// still running (deadline.go): it ends at once here.
				slot, err := a.AddMember(f)
				for deadline := time.Now().Add(10 * time.Second); errors.Is(err, ErrBusy) && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
					slot, err = a.AddMember(f)
				}
				if err != nil || slot != i {
					t.Fatalf("re-add member %d: slot %d, %v", i, slot, err)
				}
				events["re-add"]++
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("ops %d, chaos %v", ops.Load(), events)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := a.WaitSync(wctx); err != nil {
		t.Fatal(err)
	}
	verify := func(a *Array) {
		t.Helper()
		if st := a.Status(); st.State != ArrayOptimal {
			t.Fatalf("state %v: %+v", st.State, st.Members)
		}
		got := make([]byte, a.Size())
		if _, err := a.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			for off := 0; off < len(got); off += BlockSize {
				if !bytes.Equal(got[off:off+BlockSize], model[off:off+BlockSize]) {
					t.Fatalf("data differs from the model at %d", off)
				}
			}
		}
		res, err := a.Check(wctx)
		if err != nil || res.Mismatches != 0 {
			t.Fatalf("check: %+v %v", res, err)
		}
	}
	verify(a)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ms2 := make([]Member, n)
	for i := range ms2 {
		ms2[i] = bases[n-1-i]
	}
	b, err := Assemble(ms2, AssembleOptions{Options: testOpts()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if st := b.Status(); st.Sync.Running || st.DirtyRegions != 0 {
		t.Errorf("clean assemble should need no sync: %+v", st)
	}
	verify(b)
	if _, err := b.ReadAt(make([]byte, BlockSize), 0); errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}
