package raid10

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The fault matrix: seeded rounds in which faults of every kind are
// injected at any moment, during resync, recovery, scrub, grow and flushes
// as well as between them, and never waited out first. After every read,
// at the end of every round and after reassembly (after a crash with torn
// writes in half the rounds, a member broken or not): every read returns
// the last acknowledged data (after a crash: the data at the last flush or
// a value written since, or anything where a discard came after the last
// flush that covered a write), or EIO for a block that has no good copy:
// one whose copy was made unreadable by an injected fault, or that a
// failed write left undefined. Wrong data fails the test at once, with the
// block's history and what each copy held before reassembly. The counts
// are logged.
//
// `make test` runs the fixed seed set (26 fault steps a round);
// RAID10_SOAK=<duration> (make soak) runs random seeds for that long;
// RAID10_SEED=<seed> replays one round (30 steps, or RAID10_STEPS).
// After every round the array is restarted twice: in two rounds in three
// with a fault kept across the restart (restartFaulted), then calmly.
// TestFaultMatrixQueue (matrix_queue_test.go) runs the same rounds with a
// share of the foreground reads and writes on Queues (the io_uring path).

// Fault kinds of the matrix.
const (
	fkReadRange  = "unreadable-range"
	fkReadErr    = "read-eio"
	fkWriteErr   = "write-eio"
	fkStall      = "stall>deadline"
	fkDisappear  = "disappear"
	fkFail       = "fail"
	fkLatency    = "latency"
	fkCrash      = "crash-torn-writes"
	matrixMember = 4 << 20
)

func TestFaultMatrix(t *testing.T) {
	runMatrix(t, 12, 0, 26, matrixCfg{})
}

func matrixRound(t *testing.T, seed uint64, tot *matrixTotals, cfg matrixCfg) {
	t.Logf("seed %d (replay with RAID10_SEED=%d RAID10_STEPS=%d go test -run '^%s$')", seed, seed, tot.stepsPer, strings.Split(t.Name(), "/")[0])
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
	n := 2 + rng.IntN(3)
	chunk := int64(BlockSize) << rng.IntN(3)
	// fs[i] injects the faults of the member the array holds as arr[i]:
	// itself, or (Queue rounds) the ringFaulty around it.
	newMember := func() (*FaultyMember, Member) {
		f := NewFaultyMember(NewMemMember(matrixMember))
		return f, f
	}
	var rings *ringMembers
	var qc *queueCounts // the Queue rounds' counts
	if cfg.queueShare > 0 {
		qc = &tot.queue
		rings = &ringMembers{dir: t.TempDir(), size: matrixMember, c: qc}
		defer rings.close() // deferred first: runs after the last array's Close
		newMember = func() (*FaultyMember, Member) { return rings.member(t) }
	}
	fs := make([]*FaultyMember, n)
	arr := make([]Member, n)
	ms := make([]Member, n)
	volatile := rng.IntN(2) == 0
	latency := rng.IntN(2) == 0
	for i := range ms {
		fs[i], arr[i] = newMember()
		fs[i].SetVolatile(volatile)
		ms[i] = arr[i]
	}
	opts := testOpts()
	opts.SyncRateMax = 16 << 20 // syncs last long enough to be hit
	opts.SyncRateMin = 8 << 20
	opts.MemberTimeout = 250 * time.Millisecond
	size := int64(n) * 512 << 10
	maxSize := int64(n) * 1 << 20
	a, err := Create(ms, CreateOptions{Options: opts, ChunkSize: chunk, RegionSize: chunk * 8, Size: size, AssumeClean: rng.IntN(3) == 0})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs { // Create's metadata is durable
		if err := f.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	geo := a.geo
	model := newHistory(maxSize / BlockSize)
	var poisonMu sync.Mutex
	poison := map[int64]bool{} // array blocks a fault may have left without a good copy
	poisonMember := func(d int, off, length int64) {
		poisonMu.Lock()
		defer poisonMu.Unlock()
		for mb := off / BlockSize; mb < (off+length)/BlockSize; mb++ {
			if b := arrayBlockOf(&geo, d, mb); b >= 0 && b < int64(len(model)) {
				poison[b] = true
			}
		}
	}
	poisoned := func(b int64) bool {
		poisonMu.Lock()
		defer poisonMu.Unlock()
		return poison[b]
	}
	if latency {
		for _, f := range fs {
			f.SetLatency(25 * time.Microsecond)
		}
	}

	var stop atomic.Bool
	var flushing atomic.Int32
	var ops, eioRead atomic.Int64
	var wrong atomic.Int64
	const workers = 4
	section := size / workers / BlockSize
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	// checkRead checks a read of blocks [b, b+l) that returned p and err.
	checkRead := func(b, l int64, p []byte, err error) error {
		if err != nil && !errors.Is(err, syscall.EIO) {
			return fmt.Errorf("read [%d,+%d): %w", b, l, err)
		}
		for i := int64(0); i < l; i++ {
			q := p[i*BlockSize : (i+1)*BlockSize]
			if err != nil {
				// Which blocks failed: read them one by one.
				if _, e := a.ReadAt(q, (b+i)*BlockSize); e != nil {
					// Allowed: a block a fault may have left without a
					// good copy, one a failed write left undefined, or
					// any while the array says Failed (a last copy past
					// its deadline: a slow scheduler can cause it).
					if !model[b+i].indet && !poisoned(b+i) && a.State() != ArrayFailed {
						return fmt.Errorf("block %d: EIO but it has a good copy (%w); status %+v", b+i, e, a.Status())
					}
					eioRead.Add(1)
					continue
				}
			}
			if !model[b+i].matches(q, false) {
				wrong.Add(1)
				return fmt.Errorf("block %d: wrong data (it holds %s); status %+v", b+i, model[b+i].explain(q), a.Status())
			}
		}
		return nil
	}
	mq := &matrixQueue{a: a, model: model, check: checkRead}
	for w := 0; w < workers; w++ {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)+7))
		var q *Queue // the worker's, as an NBD connection's
		if cfg.queueShare > 0 && !cfg.ring {
			if q, err = a.NewQueue(8); err != nil {
				t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			bq := workerQueue(t, a, cfg, &q) // a ring queue is made here, on the worker's thread
			if q != nil {
				defer func() {
					if err := q.Close(); err != nil {
						errc <- fmt.Errorf("closing worker %d's queue: %w", w, err)
					}
					qc.add(q)
				}()
			}
			lo := int64(w) * section
			var touched []int64
			for !stop.Load() {
				if q != nil && wrng.Float64() < cfg.queueShare {
					if err := mq.batch(bq, wrng, lo, section, &touched); err != nil {
						errc <- err
						stop.Store(true)
						return
					}
					ops.Add(1)
					continue
				}
				b := lo + wrng.Int64N(section)
				l := min(lo+section-b, 1+wrng.Int64N(8))
				switch op := wrng.IntN(20); {
				case op < 8: // write
					p := make([]byte, l*BlockSize)
					fillRand(wrng, p)
					fua := wrng.IntN(6) == 0
					for i := int64(0); i < l; i++ {
						model[b+i].issue(p[i*BlockSize : (i+1)*BlockSize])
					}
					var err error
					if fua {
						_, err = a.WriteAtFUA(p, b*BlockSize)
					} else {
						_, err = a.WriteAt(p, b*BlockSize)
					}
					for i := int64(0); i < l; i++ {
						if model[b+i].done(p[i*BlockSize:(i+1)*BlockSize], err, fua) {
							touched = append(touched, b+i)
						}
					}
				case op < 16: // read and check
					p := make([]byte, l*BlockSize)
					_, err := a.ReadAt(p, b*BlockSize)
					if err := checkRead(b, l, p, err); err != nil {
						errc <- err
						stop.Store(true)
						return
					}
				case op < 17: // flush: what this worker had acknowledged is durable
					snap := make([][]byte, len(touched))
					for i, x := range touched {
						snap[i] = model[x].cur
					}
					flushing.Add(1)
					err := a.Flush()
					flushing.Add(-1)
					if err == nil {
						for i, x := range touched {
							model[x].flushed(snap[i])
						}
						touched = touched[:0]
					}
				case op < 19: // write zeroes
					for i := int64(0); i < l; i++ {
						model[b+i].issue(nil)
					}
					err := a.WriteZeroes(b*BlockSize, l*BlockSize)
					for i := int64(0); i < l; i++ {
						if model[b+i].done(nil, err, false) {
							touched = append(touched, b+i)
						}
					}
				default: // discard: contents unspecified
					_ = a.Discard(b*BlockSize, l*BlockSize)
					for i := int64(0); i < l; i++ {
						model[b+i].discard()
					}
				}
				ops.Add(1)
			}
		}()
	}

	phase := func(growing bool) string {
		st := a.Status()
		switch {
		case growing:
			return "grow"
		case st.Sync.Running:
			return st.Sync.Kind.String()
		case flushing.Load() > 0:
			return "flush"
		}
		return "idle"
	}
	ctx := context.Background()
	var bgOps sync.WaitGroup
	var growing, scrubbing atomic.Bool
	steps := tot.stepsPer
	whole := -1 // the member with a whole-device fault, if any
	for step := 0; step < steps && !stop.Load(); step++ {
		time.Sleep(time.Duration(2+rng.IntN(15)) * time.Millisecond)
		// Background operations, started at random and never awaited
		// before the next fault.
		if !scrubbing.Load() && rng.IntN(4) == 0 {
			scrubbing.Store(true)
			repair := rng.IntN(2) == 0
			bgOps.Add(1)
			go func() {
				defer bgOps.Done()
				defer scrubbing.Store(false)
				if repair {
					_, _ = a.Repair(ctx)
				} else {
					_, _ = a.Check(ctx)
				}
			}()
		}
		if !growing.Load() && a.Size() < maxSize && rng.IntN(5) == 0 {
			growing.Store(true)
			to := min(maxSize, a.Size()+int64(1+rng.IntN(4))*chunk*int64(n))
			bgOps.Add(1)
			go func() {
				defer bgOps.Done()
				defer growing.Store(false)
				_ = a.Grow(to) // ErrBusy while not optimal: fine
			}()
		}
		time.Sleep(time.Duration(rng.IntN(4)) * time.Millisecond)
		i := rng.IntN(n)
		f := fs[i]
		kinds := []string{fkReadRange, fkReadErr, fkLatency}
		if whole < 0 {
			kinds = append(kinds, fkWriteErr, fkStall, fkDisappear, fkFail)
		}
		kind := kinds[rng.IntN(len(kinds))]
		ph := phase(growing.Load())
		switch kind {
		case fkReadRange:
			off := geo.dataOffset + rng.Int64N(geo.dataSize/BlockSize)*BlockSize
			l := int64(1+rng.IntN(16)) * BlockSize
			poisonMember(i, off, l)
			f.FailRange(off, l, true, false)
		case fkReadErr:
			// A burst of read errors anywhere on the member: the reads
			// that meet it are served and healed from the other copy, or
			// (where none is left) recorded bad.
			poisonMember(i, geo.dataOffset, geo.dataSize)
			f.FailReadsAfter(int64(rng.IntN(30)))
		case fkLatency:
			f.SetLatency(time.Duration(rng.IntN(2000)) * time.Microsecond)
		case fkWriteErr:
			whole = i
			poisonMember(i, geo.dataOffset, geo.dataSize)
			f.FailWritesAfter(int64(rng.IntN(20)))
		case fkStall:
			whole = i
			poisonMember(i, geo.dataOffset, geo.dataSize)
			f.Stall()
		case fkDisappear:
			whole = i
			poisonMember(i, geo.dataOffset, geo.dataSize)
			f.Disappear()
		case fkFail:
			whole = i
			_ = a.FailMember(i) // ErrLastCopy when its partner is out
		}
		tot.fault(kind, ph)
		hold := time.Duration(5+rng.IntN(40)) * time.Millisecond
		if kind == fkStall {
			hold = opts.MemberTimeout * time.Duration(2+rng.IntN(3))
		}
		time.Sleep(hold)
		// Faults end; a read-range fault may stay a few steps longer.
		if kind != fkReadRange || rng.IntN(3) == 0 {
			f.ClearFaults()
		}
		f.Unstall()
		f.Reappear()
		if latency {
			f.SetLatency(25 * time.Microsecond)
		} else {
			f.SetLatency(0)
		}
		if whole >= 0 {
			w := whole
			switch MemberState(a.slots[w].state.Load()) {
			case MemberInSync:
				whole = -1
			case MemberFaulty, MemberMissing:
				// Back in: re-add (bitmap recovery) or a blank disk (full).
				var err error
				if rng.IntN(3) == 0 {
					fs[w], arr[w] = newMember()
					fs[w].SetVolatile(volatile)
					if latency {
						fs[w].SetLatency(25 * time.Microsecond)
					}
					err = a.ReplaceMember(w, arr[w])
				} else {
					_, err = a.AddMember(arr[w])
				}
				if err == nil {
					whole = -1 // recovering now; faults may hit it again
				} else if !errors.Is(err, ErrBusy) {
					t.Fatalf("re-adding member %d: %v", w, err)
				}
			}
		}
		tot.mu.Lock()
		tot.steps++
		tot.mu.Unlock()
	}
	stop.Store(true)
	wg.Wait()
	bgOps.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for _, f := range fs {
		f.ClearFaults()
		f.Unstall()
		f.Reappear()
		f.SetLatency(0)
	}
	for _, s := range a.slots {
		if r := s.ref.Load(); r != nil {
			tot.mu.Lock()
			tot.timeouts += s.timeouts.Load()
			tot.mu.Unlock()
		}
	}
	crashed := volatile && rng.IntN(2) == 0
	brokenAtCrash := a.anyBroken()
	var atEnd []string // the slots as the round left them, for the report
	for _, s := range a.slots {
		r := s.ref.Load()
		d := fmt.Sprintf("slot %d: %v", s.idx, MemberState(s.state.Load()))
		if s.broken.Load() {
			d += " broken"
		}
		if r != nil {
			d += fmt.Sprintf(" timedOut %v bad %v", r.timedOut.Load(), r.bad.Load().ranges())
		}
		atEnd = append(atEnd, d)
	}
	if crashed && brokenAtCrash {
		// A member failed but no superblock could record it (most
		// crash rounds end so: a member past its deadline that holds a
		// last copy stays broken).
		t.Logf("crash with a member broken: %s", strings.Join(atEnd, "; "))
		tot.mu.Lock()
		tot.crashBroken++
		tot.mu.Unlock()
	}
	if crashed {
		tot.fault(fkCrash, phase(false))
		var crashWait func()
		if rings != nil { // Queue writes in flight when the power goes
			var inflight func() int
			inflight, crashWait = crashBatch(t, a, model, rng, qc)
			qc.crashInflight.Add(uint64(inflight()))
		}
		for _, k := range rng.Perm(n) {
			fs[k].Disappear()
		}
		for _, f := range fs {
			f.Crash(rng)
		}
		if crashWait != nil {
			crashWait()
		}
		_ = a.Close() // the members are gone: only stops the goroutines
		// A crash ends every call of the old process: none may land after
		// the reboot (here the old array's goroutines live on).
		a.workers.Wait()
		a.late.Wait()
		a.fails.Wait()
		for _, f := range fs {
			f.Crash(nil) // whatever the late calls cached is lost too
			f.Reappear()
		}
	} else {
		// Members that are out come back first, so Close leaves them
		// assemblable (a stale member is rebuilt after Assemble).
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_ = a.WaitSync(wctx)
		cancel()
		if err := a.Close(); err != nil {
			t.Logf("close: %v", err)
		}
		a.workers.Wait() // abandoned calls end before the members are reused
		a.late.Wait()
		a.fails.Wait()
		for _, f := range fs {
			if err := f.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rings != nil {
		rings.quiesce(t)
	}
	ms2 := make([]Member, n)
	for k, p := range rng.Perm(n) {
		ms2[k] = arr[p]
	}
	// What reassembly starts from, for the report of a wrong block.
	image := make([][]byte, n) // by slot
	var sbs []string
	for _, f := range fs {
		sb, err := readSuperblock(f)
		if err != nil {
			continue
		}
		buf := make([]byte, f.Size())
		if _, err := f.ReadAt(buf, 0); err == nil && int(sb.role) < n {
			image[sb.role] = buf
		}
		sbs = append(sbs, fmt.Sprintf("slot %d: events %d clean %v recovery %d slots %v bad %v", sb.role, sb.events, sb.clean, int64(sb.recoveryOff), sb.slots[:n], sb.bad))
	}
	copiesOf := func(blk int64) string {
		c, within := blk*BlockSize>>geo.chunkShift, blk*BlockSize&(geo.chunk-1)
		d0, d1, o0, o1 := geo.mapChunk(c)
		var out []string
		for k, d := range []int{d0, d1} {
			o := []int64{o0, o1}[k] + within
			if image[d] == nil || o+BlockSize > int64(len(image[d])) {
				out = append(out, fmt.Sprintf("slot %d: no image", d))
				continue
			}
			out = append(out, fmt.Sprintf("slot %d (member block %d): %s", d, o/BlockSize, model[blk].explain(image[d][o:o+BlockSize])))
		}
		return strings.Join(out, "; ")
	}
	for _, f := range fs {
		f.SetVolatile(false)
	}
	if k := rng.IntN(len(restartFaults) + restartFaultless); k < len(restartFaults) {
		kind := restartFaults[k]
		tot.fault(kind, "restart")
		restartFaulted(t, rng, kind, restartEnv{
			fs: fs, arr: arr, ms: ms2, queue: qc, opts: opts, geo: &geo, model: model, crashed: crashed,
			poisonMember: poisonMember, poisoned: poisoned, wrong: &wrong, tot: tot,
		})
	}
	if rings != nil {
		rings.quiesce(t) // the restart's abandoned copies have landed
	}
	// No faults from here on: a deadline the loaded test machine cannot
	// miss, so a slow scheduler never fails a member.
	calm := opts
	calm.MemberTimeout = 10 * time.Second
	calm.SyncRateMax, calm.SyncRateMin = -1, 1<<40 // only verification from here
	b, err := Assemble(ms2, AssembleOptions{Options: calm})
	if err != nil {
		t.Fatalf("assemble after the round (crash %v): %v", crashed, err)
	}
	defer b.Close()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.WaitSync(wctx); err != nil {
		t.Fatal(err)
	}
	st := b.Status()
	if st.State == ArrayFailed {
		t.Fatalf("failed after reassembly: %+v", st)
	}
	var eioEnd, discardsAfter int64
	readAllBlocks(t, b, qc, func(blk int64, p []byte, err error) {
		if err != nil {
			if !errors.Is(err, syscall.EIO) || !model[blk].indet && !poisoned(blk) {
				t.Errorf("block %d after reassembly: %v (it has a good copy)", blk, err)
			}
			eioEnd++
			return
		}
		if crashed && model[blk].discarded {
			m := model[blk]
			m.discarded = false
			if !m.matches(p, crashed) {
				discardsAfter++ // allowed: see TestCrashModelDiscard
			}
		}
		if !model[blk].matches(p, crashed) {
			wrong.Add(1)
			t.Errorf("block %d after reassembly (crash %v): wrong data: it holds %s; the copies before reassembly: %s\nslots at the end of the round: %s\nsuperblocks: %s",
				blk, crashed, model[blk].explain(p), copiesOf(blk), strings.Join(atEnd, "; "), strings.Join(sbs, "; "))
		}
	})
	if st.LostBlocks != eioEnd {
		t.Errorf("engine reports %d lost blocks, %d read as EIO", st.LostBlocks, eioEnd)
	}
	res, err := b.Check(wctx)
	if err != nil || res.Mismatches != 0 {
		t.Errorf("check after reassembly: %+v %v", res, err)
		// Which blocks, and what each copy holds.
		p, q := make([]byte, BlockSize), make([]byte, BlockSize)
		for blk := int64(0); blk < b.Size()/BlockSize; blk++ {
			c, within := blk*BlockSize>>geo.chunkShift, blk*BlockSize&(geo.chunk-1)
			d0, d1, o0, o1 := b.geo.mapChunk(c)
			r0, r1 := b.slots[d0].ref.Load(), b.slots[d1].ref.Load()
			if _, err := r0.m.ReadAt(p, o0+within); err != nil {
				continue
			}
			if _, err := r1.m.ReadAt(q, o1+within); err != nil || bytes.Equal(p, q) {
				continue
			}
			t.Errorf("block %d: slot %d holds %s, slot %d holds %s; before reassembly: %s\nslots at the end of the round: %s\nsuperblocks: %s",
				blk, d0, model[blk].explain(p), d1, model[blk].explain(q), copiesOf(blk), strings.Join(atEnd, "; "), strings.Join(sbs, "; "))
		}
	}
	// The superblocks agree with Status: after Close every member's own
	// superblock is in sync, clean, and carries the bad blocks Status
	// counted for it.
	st = b.Status()
	if err := b.Close(); err != nil {
		t.Errorf("close after reassembly: %v", err)
	}
	for _, m := range ms2 {
		sb, err := readSuperblock(m)
		if err != nil {
			t.Fatalf("superblock after close: %v", err)
		}
		ms := st.Members[sb.role]
		var bad int64
		for _, r := range sb.bad {
			bad += r.count
		}
		if !sb.clean || sb.recoveryOff != recoveryDone || sb.slots[sb.role] != slotActive || ms.State != MemberInSync || bad != ms.BadBlocks {
			t.Errorf("member %d: superblock clean %v recovery %d slot %d bad %d; status %v bad %d",
				sb.role, sb.clean, sb.recoveryOff, sb.slots[sb.role], bad, ms.State, ms.BadBlocks)
		}
	}
	t.Logf("members %d chunk %d volatile %v latency %v crash %v (a member broken %v): ops %d, EIO blocks %d during, %d after; bad %d lost %d; discards' leftovers %d",
		n, chunk, volatile, latency, crashed, crashed && brokenAtCrash, ops.Load(), eioRead.Load(), eioEnd, st.BadBlocks, st.LostBlocks, discardsAfter)
	tot.mu.Lock()
	tot.rounds++
	tot.ops += ops.Load()
	tot.eioRead += eioRead.Load()
	tot.eioEnd += eioEnd
	tot.lostRep += st.LostBlocks
	tot.wrong += wrong.Load()
	tot.discardsAfter += discardsAfter
	tot.mu.Unlock()
}
