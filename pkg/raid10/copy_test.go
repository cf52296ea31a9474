package raid10

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cutWrite is one write to a block of the source, with the cut phase at its
// start and at its end (0 before NewCopy, 1 during it, 2 after).
type cutWrite struct {
	val    []byte
	ps, pe int32
	acked  bool
}

// cutHist is one block's history: what the snapshot may hold (its value
// before the cut, or a write that overlapped the cut) and what the source
// may hold after a crash (the crash-history model, as in TestCrash).
type cutHist struct {
	blockHistory
	initial []byte
	writes  []cutWrite
}

// snapAllowed is what the snapshot may hold for the block: the last value
// acknowledged before the cut began, or any write that overlapped the cut
// (or failed before it ended: it may have reached the source).
func (h *cutHist) snapAllowed() [][]byte {
	last := h.initial
	var out [][]byte
	for _, w := range h.writes {
		switch {
		case w.pe == 0 && w.acked:
			last = w.val
		case w.ps <= 1 && (w.pe >= 1 || !w.acked):
			out = append(out, w.val)
		}
	}
	return append(out, last)
}

// copyRig is a source and a target array over in-memory members with
// volatile caches.
type copyRig struct {
	srcBase, tgtBase []*MemMember
	srcF, tgtF       []*FaultyMember
	src, tgt         *Array
	tgtOpts          Options
}

func newCopyRig(t *testing.T, rng *rand.Rand, volatile bool) *copyRig {
	t.Helper()
	old, oldBatch := copyRegionMin, copyBatch
	copyRegionMin, copyBatch = 4<<10, 32<<10
	t.Cleanup(func() { copyRegionMin, copyBatch = old, oldBatch })
	r := &copyRig{}
	n, m := 2+rng.IntN(3), 2+rng.IntN(2)
	mk := func(k int, size int64) ([]*MemMember, []*FaultyMember, []Member) {
		bs, fs, ms := make([]*MemMember, k), make([]*FaultyMember, k), make([]Member, k)
		for i := range bs {
			bs[i] = NewMemMember(size)
			fs[i] = NewFaultyMember(bs[i])
			fs[i].SetVolatile(volatile)
			ms[i] = fs[i]
		}
		return bs, fs, ms
	}
	var sm, tm []Member
	r.srcBase, r.srcF, sm = mk(n, 2<<20)
	var err error
	r.src, err = Create(sm, CreateOptions{Options: testOpts(), ChunkSize: int64(BlockSize) << rng.IntN(3), AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	size := r.src.Size()
	need := 2 << 20
	r.tgtBase, r.tgtF, tm = mk(m, (size+CopyRecordSize)*2/int64(m)+int64(need))
	// A slow copier, so the crash and the faults land inside the copy.
	r.tgtOpts = Options{SyncRateMin: 2 << 20, SyncRateMax: 6 << 20, BitmapClearDelay: 50 * time.Millisecond}
	r.tgt, err = Create(tm, CreateOptions{Options: r.tgtOpts, ChunkSize: int64(BlockSize) << rng.IntN(3),
		Size: size + CopyRecordSize, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.tgt.Reserve(CopyRecordSize); err != nil {
		t.Fatal(err)
	}
	for _, f := range append(append([]*FaultyMember(nil), r.srcF...), r.tgtF...) {
		if err := f.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// runCutWriters runs writers over disjoint sections of the source until
// stop, recording every write in hist, with the cut phase (phase) at its
// start and at its end.
func runCutWriters(a *Array, seed uint64, hist []cutHist, phase *atomic.Int32, stop *atomic.Bool, wg *sync.WaitGroup) {
	w := histWriters{a: a, model: cutModel(hist), blocks: int64(len(hist)), writers: 4, seed: seed, stream: 7, flushOneIn: 8, pauseOneIn: 4,
		around: func(b, l int64, p []byte) func(error) {
			ps := phase.Load()
			return func(err error) {
				pe := phase.Load()
				for i := range l {
					hist[b+i].writes = append(hist[b+i].writes, cutWrite{val: p[i*BlockSize : (i+1)*BlockSize], ps: ps, pe: pe, acked: err == nil})
				}
			}
		}}
	w.start(stop, wg)
}

// cutModel is the source's crash-history model held in hist.
func cutModel(hist []cutHist) histModel {
	return func(b int64) *blockHistory { return &hist[b].blockHistory }
}

// prefill writes random data over the whole source and flushes it.
func prefill(t *testing.T, a *Array, rng *rand.Rand) []cutHist {
	t.Helper()
	p := make([]byte, a.Size())
	fillRand(rng, p)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	hist := make([]cutHist, a.Size()/BlockSize)
	for i := range hist {
		v := p[int64(i)*BlockSize : int64(i+1)*BlockSize]
		hist[i].initial = v
		hist[i].issue(v)
		hist[i].done(v, nil, true) // durable: flushed above
	}
	return hist
}

// checkSnapshot reads the target block by block: each block holds a value
// the model allows, or (lostOK) fails with EIO. It returns the EIO count.
func checkSnapshot(t *testing.T, tgt *Array, hist []cutHist, lostOK func(b int) bool) int {
	t.Helper()
	lost := 0
	g := make([]byte, BlockSize)
	for i := range hist {
		if _, err := tgt.ReadAt(g, int64(i)*BlockSize); err != nil {
			if errors.Is(err, ErrIO) && lostOK(i) {
				lost++
				continue
			}
			t.Fatalf("snapshot block %d: %v", i, err)
		}
		if !oneOf(g, hist[i].snapAllowed()) {
			t.Fatalf("snapshot block %d holds data that was not the source's at the cut (%d writes to it)", i, len(hist[i].writes))
		}
	}
	return lost
}

// TestCopyCrash cuts a snapshot of a source under concurrent writes, crashes
// every member (source and target) at a random point of the copy (their
// unflushed writes dropped or kept at random), reassembles both, resumes the
// copy and checks: the source holds every acknowledged write (as
// TestCrash), and the snapshot holds exactly the source's data as of the cut
// (compared with the model; a write that overlapped the cut may be in or
// out), after more writes to the source under the resumed hook. One round
// in three a Repair of the source runs with the copy into the crash.
//
// make test runs a fixed set of seeds; RAID10_SOAK=<duration> (make soak)
// runs random ones for that long; RAID10_SEED=<seed> replays one (the
// subtest's name).
func TestCopyCrash(t *testing.T) {
	runSeeds(t, 10, 0xc0, copyCrashRound)
}

func copyCrashRound(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xc0b1))
	r := newCopyRig(t, rng, true)
	hist := prefill(t, r.src, rng)
	for _, f := range append(append([]*FaultyMember(nil), r.srcF...), r.tgtF...) {
		_ = f.Flush()
	}
	var phase atomic.Int32
	var stop atomic.Bool
	var wg sync.WaitGroup
	runCutWriters(r.src, seed, hist, &phase, &stop, &wg)
	time.Sleep(time.Duration(5+rng.IntN(30)) * time.Millisecond)
	// invalid is the pool's durable record of a failed copy (its labels):
	// OnFail records it only while the power is on.
	var invalid, off atomic.Bool
	phase.Store(1)
	c, err := NewCopy(CopyConfig{Source: r.src, Target: r.tgt, Size: r.src.Size(), Live: true,
		OnFail: func(error) {
			if !off.Load() {
				invalid.Store(true)
			}
		}})
	phase.Store(2)
	if err != nil {
		t.Fatal(err)
	}
	c.Start()
	// One round in three, Repairs of the source run one after the other
	// into the crash (its own generator: the other draws, and so the fixed
	// seeds, stay).
	repaired := make(chan struct{})
	if rand.New(rand.NewPCG(seed, 0x5c7b)).IntN(3) == 0 {
		go func() {
			defer close(repaired)
			n := 0
			for ; !stop.Load(); n++ {
				if _, err := r.src.Repair(context.Background()); errors.Is(err, ErrClosed) {
					break
				}
			}
			t.Logf("%d Repairs of the source ran with the copy", n)
		}()
	} else {
		close(repaired)
	}
	// The crash point: a random share of the copy done (one round in ten
	// after it is ready).
	at := int64(rng.Float64() * 1.1 * float64(r.src.Size()))
	for deadline := time.Now().Add(5 * time.Second); c.Copied() < at && c.Copied() < r.src.Size() && time.Now().Before(deadline); {
		time.Sleep(200 * time.Microsecond)
	}
	t.Logf("crash at %d of %d bytes copied (aimed at %d)", c.Copied(), r.src.Size(), at)
	// Power loss: every member at once (two rounds in three), or one by
	// one in a random order (a target that goes first fails the copy).
	all := append(append([]*FaultyMember(nil), r.srcF...), r.tgtF...)
	slow := rng.IntN(3) == 0
	for _, i := range rng.Perm(len(all)) {
		all[i].Disappear()
		if slow {
			time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
		}
	}
	off.Store(true)
	stop.Store(true)
	wg.Wait()
	c.Stop()
	failed := c.Err() != nil
	for _, f := range all {
		f.Crash(rng)
	}
	_ = r.src.Close()
	_ = r.tgt.Close()
	<-repaired

	asm := func(bs []*MemMember, o Options) *Array {
		ms := make([]Member, len(bs))
		for i := range bs {
			ms[i] = bs[i]
		}
		a, err := Assemble(ms, AssembleOptions{Options: o})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	src, tgt := asm(r.srcBase, testOpts()), asm(r.tgtBase, testOpts())
	defer src.Close()
	defer tgt.Close()
	if err := tgt.Reserve(CopyRecordSize); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c2, err := ResumeCopy(CopyConfig{Source: src, Target: tgt})
	if errors.Is(err, ErrCopyStale) && failed {
		// A target member went first and the copy's failure did not reach its record; the
		// source, still powered, moved its copy generation on (Copy.void) before taking
		// writes without the hook, so the record is refused instead of resumed.
		t.Logf("copy failed before the crash, unrecorded: its record is refused (%v)", err)
		checkCrashed(t, "source", src, cutModel(hist))
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	// The source: every acknowledged write (before any new write).
	checkCrashed(t, "source", src, cutModel(hist))
	rec := c2.Record()
	resumed := c2.Copied()
	if invalid.Load() || rec.State == CopyFailed {
		t.Logf("copy failed before the crash (a target member went first): state %v, failure recorded %v", rec.State, invalid.Load())
		if !invalid.Load() {
			t.Fatal("the record says failed but OnFail was not called")
		}
		return
	}
	if rec.State != CopyRunning && rec.State != CopyReady {
		t.Fatalf("record state %v", rec.State)
	}
	c2.Start()
	// New writes under the resumed hook must not reach the snapshot.
	wrng := rand.New(rand.NewPCG(seed, 99))
	for range 50 {
		b := wrng.Int64N(int64(len(hist)))
		p := make([]byte, BlockSize)
		fillRand(wrng, p)
		if _, err := src.WriteAt(p, b*BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	if err := c2.Wait(ctx); err != nil {
		t.Fatalf("resumed copy: %v (record %+v)", err, rec)
	}
	// Blocks the crash made unreadable on the source before their copy
	// (members vanishing one by one) are recorded lost: EIO, never zeroes.
	lost := checkSnapshot(t, tgt, hist, func(int) bool { return true })
	t.Logf("snapshot checked: %d blocks, %d lost (EIO), resumed with %d of %d bytes copied", len(hist), lost, resumed, rec.Size)
	if st, err := ReadCopyRecord(tgt); err != nil || st.State != CopyReady {
		t.Fatalf("record after the copy: %+v %v", st, err)
	}
	if h := src.hooks.Load(); h != nil {
		t.Fatalf("hooks left on the source after ready: %+v", h)
	}
}

// TestCopyFaults: faults during the copy never give wrong data. A member of
// the source or of the target fails (both arrays degrade, the copy goes
// on); blocks no copy of the source can read become lost on the snapshot
// (EIO), not zeroes; a target that fails as a whole fails the copy (OnFail
// is called before source writes into uncopied regions go on).
func TestCopyFaults(t *testing.T) {
	seed := uint64(0xfa175eed)
	if os.Getenv("RAID10_SEED") != "" || os.Getenv("RAID10_SOAK") != "" {
		seed = testSeed(t)
	}
	t.Logf("seed %d (replay with RAID10_SEED=%d)", seed, seed)
	for _, kind := range []string{"source-member", "target-member", "source-unreadable", "target-gone", "source-repair-read-faults", "grow-refused"} {
		t.Run(kind, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0xfa17))
			r := newCopyRig(t, rng, false)
			defer r.src.Close()
			defer r.tgt.Close()
			hist := prefill(t, r.src, rng)
			var phase atomic.Int32
			phase.Store(2)
			// Unreadable source blocks: the last region, on both copies.
			var badLo, badHi int64
			if kind == "source-unreadable" {
				badLo = r.src.Size()/BlockSize - 3
				badHi = badLo + 1
				c := badLo * BlockSize >> r.src.geo.chunkShift
				d0, d1, o0, o1 := r.src.geo.mapChunk(c)
				within := badLo * BlockSize & (r.src.geo.chunk - 1)
				r.srcF[d0].FailRange(o0+within, BlockSize, true, false)
				r.srcF[d1].FailRange(o1+within, BlockSize, true, false)
			}
			var failed atomic.Bool
			c, err := NewCopy(CopyConfig{Source: r.src, Target: r.tgt, Size: r.src.Size(), Live: true,
				OnFail: func(error) { time.Sleep(20 * time.Millisecond); failed.Store(true) }})
			if err != nil {
				t.Fatal(err)
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			// Writers start after the cut: skip the unreadable blocks (a write
			// would make them good on the source again).
			if kind == "source-unreadable" {
				hist = hist[:badLo]
			}
			runCutWriters(r.src, seed, hist, &phase, &stop, &wg)
			c.Start()
			time.Sleep(50 * time.Millisecond)
			switch kind {
			case "source-member":
				if err := r.src.FailMember(0); err != nil {
					t.Fatal(err)
				}
			case "target-member":
				if err := r.tgt.FailMember(1); err != nil {
					t.Fatal(err)
				}
			case "target-gone":
				for _, f := range r.tgtF {
					f.Disappear()
				}
			}
			// A Repair of the source runs with the copy, its member 1
			// failing reads from now on (the copier's and the scrub's reads
			// heal from the other copy, or fail the member as a whole).
			repaired := make(chan error, 1)
			if kind == "source-repair-read-faults" {
				r.srcF[1].FailReadsAfter(int64(rng.IntN(64)))
				go func() {
					_, err := r.src.Repair(context.Background())
					repaired <- err
				}()
			}
			if kind == "grow-refused" {
				// Neither array grows while the copy runs (the target's
				// record sits at its end; the source's hooks cover its size).
				for name, a := range map[string]*Array{"source": r.src, "target": r.tgt} {
					if err := a.Grow(a.size.Load() + a.geo.chunk); !errors.Is(err, ErrBusy) {
						t.Fatalf("%s Grow during the copy: %v, want ErrBusy", name, err)
					}
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			err = c.Wait(ctx)
			stop.Store(true)
			wg.Wait()
			if kind == "source-repair-read-faults" {
				if err := <-repaired; err != nil {
					t.Fatalf("Repair during the copy: %v", err)
				}
				r.srcF[1].ClearFaults()
				m := r.src.Status().Members[1]
				if m.ReadErrors == 0 {
					t.Fatal("no read fault met: the Repair and the copier ran without the fault")
				}
				t.Logf("%s: source member 1 %v, %d read errors", kind, m.State, m.ReadErrors)
			}
			if kind == "target-gone" {
				if !errors.Is(err, ErrCopyFailed) || !failed.Load() {
					t.Fatalf("copy into a target that went: %v, OnFail done %v", err, failed.Load())
				}
				// The source goes on: a write into any region works.
				p := make([]byte, BlockSize)
				if _, err := r.src.WriteAt(p, r.src.Size()-BlockSize); err != nil {
					t.Fatalf("source write after the copy failed: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			lost := checkSnapshot(t, r.tgt, hist, func(int) bool { return false })
			if kind == "source-unreadable" {
				g := make([]byte, BlockSize)
				for b := badLo; b < badHi; b++ {
					if _, err := r.tgt.ReadAt(g, b*BlockSize); !errors.Is(err, ErrIO) {
						t.Fatalf("snapshot block %d, unreadable on the source at the copy: read gave %v, want EIO", b, err)
					}
				}
				if st := r.tgt.Status(); st.LostBlocks != badHi-badLo {
					t.Fatalf("snapshot lost blocks %d, want %d", st.LostBlocks, badHi-badLo)
				}
			}
			t.Logf("%s: snapshot matches the cut (%d lost)", kind, lost)
		})
	}
}

// TestCopyHydrate: a target serves the cut at once. Reads of uncopied regions (small and
// large, the large ones in parallel parts) copy them first; writes into the target
// before its copier got there stay (the copier never overwrites them); writes to the
// source after the cut never reach the target.
func TestCopyHydrate(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 0x4d))
	r := newCopyRig(t, rng, false)
	defer r.src.Close()
	defer r.tgt.Close()
	hist := prefill(t, r.src, rng)
	size := r.src.Size()
	want := make([]byte, size)
	for i := range hist {
		copy(want[int64(i)*BlockSize:], hist[i].initial)
	}
	c, err := NewCopy(CopyConfig{Source: r.src, Target: r.tgt, Size: size, Live: true})
	if err != nil {
		t.Fatal(err)
	}
	// The copier is not started yet: every region is uncopied.
	p := make([]byte, 256<<10)
	fillRand(rng, p)
	if _, err := r.src.WriteAt(p, 0); err != nil { // copies its regions first
		t.Fatal(err)
	}
	tw := make([]byte, 3*BlockSize)
	fillRand(rng, tw)
	twOff := size/2 + BlockSize
	if _, err := r.tgt.WriteAt(tw, twOff); err != nil { // hydrates, then writes
		t.Fatal(err)
	}
	copy(want[twOff:], tw)
	small := make([]byte, BlockSize)
	if _, err := r.tgt.ReadAt(small, size-BlockSize); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(small, want[size-BlockSize:]) {
		t.Fatal("small read of an uncopied target region")
	}
	big := make([]byte, size)
	if _, err := r.tgt.ReadAt(big, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(big, want) {
		t.Fatal("large read of the target before its copier ran")
	}
	c.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.tgt.ReadAt(big, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(big, want) {
		t.Fatal("target after its copy: a write into it was overwritten, or the source's later write reached it")
	}
	r.src.metaMu.Lock()
	n := r.src.liveCopies
	r.src.metaMu.Unlock()
	if n != 0 {
		t.Fatalf("a finished copy still counted on its source: %d", n)
	}
}

// TestCopyStale: a source assembled and served while the target of its running copy is
// absent moves its copy generation on (CopiesResumed), so that copy's record is refused
// when the target comes back (its bitmap no longer says what the source holds); a source
// assembled with its target resumes normally and keeps its generation.
func TestCopyStale(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 0x57a1e))
	r := newCopyRig(t, rng, false)
	prefill(t, r.src, rng)
	c, err := NewCopy(CopyConfig{Source: r.src, Target: r.tgt, Size: r.src.Size(), Live: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Stop() // a shutdown with the copy running: still counted
	_ = r.src.Close()
	_ = r.tgt.Close()
	// Both present: resumed, generation unchanged.
	src, tgt := assembleMem(t, r.srcBase), assembleMem(t, r.tgtBase)
	if err := tgt.Reserve(CopyRecordSize); err != nil {
		t.Fatal(err)
	}
	c2, err := ResumeCopy(CopyConfig{Source: src, Target: tgt})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.CopiesResumed(); err != nil || src.copyGen != 0 || src.liveCopies != 1 {
		t.Fatalf("resumed with its target: generation %d, running %d, %v", src.copyGen, src.liveCopies, err)
	}
	c2.Stop()
	_ = src.Close()
	_ = tgt.Close()
	// The target absent: the source is served, the generation moves on.
	src = assembleMem(t, r.srcBase)
	if err := src.CopiesResumed(); err != nil || src.copyGen != 1 || src.liveCopies != 0 {
		t.Fatalf("served without its copy's target: generation %d, running %d, %v", src.copyGen, src.liveCopies, err)
	}
	p := make([]byte, BlockSize)
	fillRand(rng, p)
	if _, err := src.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	_ = src.Close()
	// The target is back: its record is void.
	src, tgt = assembleMem(t, r.srcBase), assembleMem(t, r.tgtBase)
	defer src.Close()
	defer tgt.Close()
	if err := tgt.Reserve(CopyRecordSize); err != nil {
		t.Fatal(err)
	}
	if _, err := ResumeCopy(CopyConfig{Source: src, Target: tgt}); !errors.Is(err, ErrCopyStale) {
		t.Fatalf("resume after the source was served without the hook: %v", err)
	}
}
