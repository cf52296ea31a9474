package raid10

import (
	"fmt"
	"time"
)

// The write path: WriteAt, WriteAtFUA, Discard and WriteZeroes split into
// chunk pieces written to every live copy, the rule that acknowledges them,
// and Flush.

// handoffLatency is the member write latency above which the two copies of
// a write are issued in parallel (see writePiece).
const handoffLatency = 20 * time.Microsecond

// WriteAt writes p at off to every live copy concurrently and returns when
// all have it. off and len(p) must be multiples of BlockSize.
func (a *Array) WriteAt(p []byte, off int64) (int, error) {
	a.limitRequest(true, int64(len(p)))
	return a.write(opWrite, p, off, int64(len(p)), false, false)
}

// WriteAtFUA is WriteAt followed by a flush of the members written, so the
// data is durable on every live copy before it returns.
func (a *Array) WriteAtFUA(p []byte, off int64) (int, error) {
	a.limitRequest(true, int64(len(p)))
	return a.write(opWrite, p, off, int64(len(p)), true, false)
}

// Discard passes a discard of [off, off+length) to the members. The range
// reads back as unspecified data (zeroes on file members).
func (a *Array) Discard(off, length int64) error {
	a.limitRequest(true, 0)
	_, err := a.write(opDiscard, nil, off, length, false, false)
	return err
}

// WriteZeroes makes [off, off+length) read back as zeroes on every copy.
func (a *Array) WriteZeroes(off, length int64) error {
	a.limitRequest(true, 0)
	_, err := a.write(opZeroes, nil, off, length, false, false)
	return err
}

// write splits a request into chunk pieces; raw requests (a copy's own
// I/O) reach the reserved tail and skip the copy hooks.
func (a *Array) write(op opKind, p []byte, off, length int64, fua, raw bool) (int, error) {
	if err := a.check(off, length, raw); err != nil {
		return 0, err
	}
	var done int64
	for done < length {
		aoff := off + done
		n := min(length-done, a.geo.chunk-aoff&(a.geo.chunk-1))
		var q []byte
		if p != nil {
			q = p[done : done+n]
		}
		if err := a.writePiece(op, q, aoff, n, fua, raw); err != nil {
			return int(done), err
		}
		done += n
	}
	return int(done), nil
}

// writePiece writes one chunk piece to every live copy: admitted into its
// bucket after the copy hooks, under the region's bitmap bit, and
// acknowledged only as acknowledged says.
func (a *Array) writePiece(op opKind, p []byte, aoff, length int64, fua, raw bool) error {
	c := aoff >> a.geo.chunkShift
	bk, err := a.enterWrite(c, aoff, length, raw)
	if err != nil {
		return err
	}
	defer a.exit(bk)
	bk.wOps.Add(1)
	bk.wBytes.Add(uint64(length))
	region := aoff / a.geo.region
	if err := a.bm.startWrite(region); err != nil {
		return err
	}
	defer a.bm.endWrite(region)
	cp := a.pieceCopies(c, aoff)
	a.writeCopies(&cp, op, p, length, fua)
	return a.finishWrite(&cp, op, c, region, length)
}

// finishWrite is the end of a written piece of chunk c, in region: it
// acknowledges the piece only as acknowledged says (else the region is
// marked for resync and the piece fails), and clears the bad blocks the
// written copies now hold good data on.
func (a *Array) finishWrite(cp *[2]pieceCopy, op opKind, c, region, length int64) error {
	if !a.acknowledged(cp, length) {
		// The copies may differ now: make them equal again (the region's
		// bit stays set until then, and an unclean Close keeps it).
		a.markResync(region)
		return fmt.Errorf("%w: chunk %d: no in-sync copy took the write, or a copy that missed it could not be failed", ErrIO, c)
	}
	// A write that put data on a copy's bad blocks makes them good there
	// (a discard does not: it leaves the contents unspecified).
	if op != opDiscard {
		for k := range cp {
			if x := &cp[k]; x.r != nil && x.err == nil && x.r.bad.Load().overlaps(x.off/BlockSize, length/BlockSize) {
				a.clearBad(x.s, x.r, x.off, length)
			}
		}
	}
	return nil
}

// enterWrite admits a write piece of [aoff, aoff+length) of chunk c into
// its bucket.
func (a *Array) enterWrite(c, aoff, length int64, raw bool) (*bucket, error) {
	bk, err := a.enter(c)
	if err != nil {
		return nil, err
	}
	// The copy hooks, checked inside the bucket (see readPiece): each region
	// of the piece whose bit is clear is copied first, outside the bucket,
	// then the piece is admitted again.
	for !raw {
		h, r, target := a.pendingCopy(aoff, length)
		if h == nil {
			break
		}
		a.exit(bk)
		if err := h.ensure(r, (aoff+length-1)>>h.shift, target); err != nil {
			return nil, err
		}
		if bk, err = a.enter(c); err != nil {
			return nil, err
		}
	}
	return bk, nil
}

// pieceCopy is one copy of a write piece.
type pieceCopy struct {
	s    *slot
	r    *memberRef // the live member at submission, nil: none
	off  int64      // member byte offset
	sync bool       // in sync (at submission; see acknowledged)
	err  error
}

// pieceCopies returns the two copies of the piece at aoff of chunk c.
func (a *Array) pieceCopies(c, aoff int64) [2]pieceCopy {
	within := aoff & (a.geo.chunk - 1)
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	cp := [2]pieceCopy{{s: a.slots[d0], off: o0 + within}, {s: a.slots[d1], off: o1 + within}}
	for k := range cp {
		cp[k].r = cp[k].s.live()
	}
	// in-sync status at submission: only those copies count for the ack.
	for k := range cp {
		cp[k].sync = cp[k].r != nil && MemberState(cp[k].s.state.Load()) == MemberInSync
	}
	return cp
}

// writeCopies writes the piece to every live copy and records each
// copy's error.
//
// Copies go to workers where the member deadline can abandon them
// (deadline.go), and the second copy also when few requests are in
// flight on members with device latency, so both are written at once.
// With a queue already, the submitters themselves give the parallelism,
// and a write that completes in memory (tmpfs, page cache) costs less
// than the hand-off, so the submitter then writes both in turn.
func (a *Array) writeCopies(cp *[2]pieceCopy, op opKind, p []byte, length int64, fua bool) {
	s0, s1 := cp[0].s, cp[1].s
	par := cp[0].r != nil && cp[1].r != nil && s0.inflight.Load()+s1.inflight.Load() < a.handoffBelow &&
		min(s0.wlat.Load(), s1.wlat.Load()) >= int64(handoffLatency)
	var reqs [2]*wreq
	for k := range cp {
		x := &cp[k]
		if x.r == nil || !a.rescue(x.s) && (k != 1 || !par) {
			continue
		}
		if req := a.reqs.pop(); req != nil {
			req.s, req.ref, req.op, req.p, req.off, req.length, req.fua = x.s, x.r, op, p, x.off, length, fua
			a.submit(req)
			reqs[k] = req
		}
	}
	for k := range cp {
		if x := &cp[k]; x.r != nil && reqs[k] == nil {
			x.err = a.memberWrite(x.s, x.r, op, p, x.off, length, fua)
		}
	}
	for k := range cp {
		if reqs[k] != nil {
			cp[k].err = a.await(reqs[k])
		}
	}
}

// acknowledged reports whether the written piece may be acknowledged; it
// fails (or records bad) the copies that missed it.
func (a *Array) acknowledged(cp *[2]pieceCopy, length int64) bool {
	// A copy that was recovering at submission counts as well if it is in
	// sync now, before the bucket is left (md's rule: In_sync at completion).
	// The recovery cannot copy this chunk while the write holds the bucket, so
	// if it has finished, it copied this chunk before the write, and the copy
	// holds the write; refusing it would fail a write the recovered copy
	// took, when the only copy in sync at submission failed.
	for k := range cp {
		if x := &cp[k]; x.r != nil && x.err == nil && !x.sync {
			x.sync = x.s.inSync() == x.r
		}
	}
	// Acknowledge only if some in-sync copy took the write and every copy
	// that did not is durably failed: a copy that errored but could not be
	// failed (the last one of some chunk: broken) still counts as in sync
	// on disk, and a resync after a crash could copy its stale data back.
	ok, lost := false, false
	for k := range cp {
		x := &cp[k]
		if x.r == nil {
			continue
		}
		if x.err != nil {
			lost = lost || !a.failed(x.s, x.r, x.err, x.off, length)
		} else if x.sync {
			ok = true
		}
	}
	return ok && !lost
}

func (a *Array) memberWrite(s *slot, r *memberRef, op opKind, p []byte, off, length int64, fua bool) error {
	if err := r.refused(); err != nil {
		s.writeErrs.Add(1)
		return err
	}
	out := &r.out[a.epoch.Load()%epochRing]
	out.Add(1)
	defer out.Add(-1)
	s.inflight.Add(1)
	// Sample the latency of one write in 16 for the hand-off decision.
	var t0 time.Time
	sample := op == opWrite && !fua && s.writeOps.Load()&15 == 0
	if sample {
		t0 = time.Now()
	}
	var err error
	switch op {
	case opWrite:
		var n int
		n, err = r.m.WriteAt(p, off)
		if err == nil && n != len(p) {
			err = fmt.Errorf("short write %d of %d", n, len(p))
		}
	case opDiscard:
		err = r.m.Discard(off, length)
	case opZeroes:
		err = r.m.WriteZeroes(off, length)
	}
	if err == nil && fua {
		err = r.m.Flush()
	}
	s.inflight.Add(-1)
	if sample {
		lat := int64(time.Since(t0))
		old := s.wlat.Load()
		s.wlat.Store(old + (lat-old)/8) // racy EWMA: a hint, lost updates are fine
	}
	s.writeOps.Add(1)
	s.wrBytes.Add(uint64(length))
	if err != nil {
		s.writeErrs.Add(1)
	}
	return err
}

// Flush makes every acknowledged write durable on every live member. A
// member whose flush fails is failed; Flush fails only if some chunk is
// left without a durable in-sync copy.
func (a *Array) Flush() error {
	if a.closed.Load() {
		return ErrClosed
	}
	errs := make([]error, len(a.slots))
	refs := make([]*memberRef, len(a.slots))
	done := make([]chan error, len(a.slots))
	for i, s := range a.slots {
		r := s.live()
		if r == nil {
			continue
		}
		refs[i] = r
		done[i] = make(chan error, 1)
		a.late.Add(1)
		go func() {
			defer a.late.Done()
			done[i] <- a.memberFlush(r)
		}()
	}
	for i := range a.slots {
		if done[i] == nil {
			continue
		}
		// A flush stuck past the deadline is abandoned with its member.
		select {
		case errs[i] = <-done[i]:
		case <-refs[i].dead:
			errs[i] = errTimedOut
		}
	}
	for i, s := range a.slots {
		if errs[i] != nil {
			a.memberFailed(s, refs[i], "flush", errs[i])
		}
	}
	if a.State() == ArrayFailed {
		return fmt.Errorf("%w: array failed", ErrIO)
	}
	return nil
}

// memberFlush flushes r, counted for the member deadline.
func (a *Array) memberFlush(r *memberRef) error {
	if err := r.refused(); err != nil {
		return err
	}
	out := &r.out[a.epoch.Load()%epochRing]
	out.Add(1)
	defer out.Add(-1)
	return r.m.Flush()
}
