package raid10

import (
	"bytes"
	"context"
	"time"

	"k8s.io/klog/v2"
)

// Scrubs: Check and Repair compare (and mend) the two copies of every
// chunk, as md's sync_action check and repair.

// Check compares the copies of every chunk and counts differing blocks,
// like writing "check" to md's sync_action. It waits for a running resync
// or recovery to end first. Progress shows in Status().Sync.
func (a *Array) Check(ctx context.Context) (ScrubResult, error) { return a.scrub(ctx, false, 0) }

// Repair is Check that also rewrites the second copy of a differing block
// from the first ("repair").
func (a *Array) Repair(ctx context.Context) (ScrubResult, error) { return a.scrub(ctx, true, 0) }

// CheckRange is Check from array offset from (rounded down to its chunk) to
// the end, so that a check cut short (its window ended, ctx cancelled) can
// resume where it stopped, as md's sync_min allows. Progress counts from the
// array's start: Status().Sync.Done includes the skipped part, and after a
// cancellation it is where to resume.
func (a *Array) CheckRange(ctx context.Context, from int64) (ScrubResult, error) {
	return a.scrub(ctx, false, from)
}

// RepairRange is Repair from array offset from to the end; see CheckRange.
func (a *Array) RepairRange(ctx context.Context, from int64) (ScrubResult, error) {
	return a.scrub(ctx, true, from)
}

func (a *Array) scrub(ctx context.Context, repair bool, from int64) (ScrubResult, error) {
	var res ScrubResult
	if from < 0 {
		return res, invalidf("scrub from %d", from)
	}
	if a.closed.Load() {
		return res, ErrClosed
	}
	for !a.syncRun.TryLock() {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-a.stop:
			return res, ErrClosed
		case <-time.After(5 * time.Millisecond):
		}
	}
	defer a.syncRun.Unlock()
	kind := SyncCheck
	if repair {
		kind = SyncRepair
	}
	a.beginProgress(kind, a.geo.size)
	defer a.endProgress()
	first := min(from>>a.geo.chunkShift, a.geo.chunks)
	a.progMu.Lock()
	a.prog.Done = min(first<<a.geo.chunkShift, a.geo.size)
	a.progBase = a.prog.Done
	a.progMu.Unlock()
	b0 := AlignedBuffer(int(a.geo.chunk))
	b1 := AlignedBuffer(int(a.geo.chunk))
	for c := first; c < a.geo.chunks; c++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if a.stopped() {
			return res, ErrClosed
		}
		if err := a.scrubChunk(c, b0, b1, repair, &res); err != nil {
			return res, err
		}
		a.progMu.Lock()
		a.prog.Done += a.chunkLen(c)
		a.prog.Mismatches = res.Mismatches
		a.progMu.Unlock()
		a.throttle()
	}
	if res.Mismatches > 0 {
		klog.InfoS("raid10: scrub found mismatches", "mismatches", res.Mismatches, "repaired", res.Repaired)
	}
	return res, nil
}

func (a *Array) scrubChunk(c int64, b0, b1 []byte, repair bool, res *ScrubResult) error {
	bk := a.raise(c)
	defer a.lower(bk)
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	s0, s1 := a.slots[d0], a.slots[d1]
	r0, r1 := s0.inSync(), s1.inSync()
	if r0 == nil || r1 == nil {
		return nil
	}
	if a.resyncActive.Load() && a.regionNeedsResync(c<<a.geo.chunkShift/a.geo.region) {
		return nil // the pending resync makes these copies equal
	}
	n := a.chunkLen(c)
	p0, p1 := b0[:n], b1[:n]
	heal := r0.bad.Load().overlaps(o0/BlockSize, n/BlockSize) || r1.bad.Load().overlaps(o1/BlockSize, n/BlockSize)
	if !heal {
		if err := a.rescuedIO(s0, r0, opRead, p0, o0); err != nil {
			s0.readErrs.Add(1)
			heal = true
		} else if err := a.rescuedIO(s1, r1, opRead, p1, o1); err != nil {
			s1.readErrs.Add(1)
			heal = true
		}
	}
	if heal {
		// Read errors and bad blocks: rewrite each bad copy from the
		// good one, record blocks that have none (md's check does the
		// same with read errors).
		res.Checked += n
		lost, _ := a.syncRange(c, 0, p0, modeRead, nil)
		res.Lost += lost
		return nil
	}
	res.Checked += n
	for off := int64(0); off < n; off += BlockSize {
		if bytes.Equal(p0[off:off+BlockSize], p1[off:off+BlockSize]) {
			continue
		}
		res.Mismatches++
		if !repair {
			continue
		}
		region := (c<<a.geo.chunkShift + off) / a.geo.region
		if err := a.bm.startWrite(region); err != nil {
			return err
		}
		err := a.rescuedIO(s1, r1, opWrite, p0[off:off+BlockSize], o1+off)
		a.bm.endWrite(region)
		if err != nil {
			a.memberFailed(s1, r1, "repair write", err)
			return nil
		}
		res.Repaired++
	}
	return nil
}
