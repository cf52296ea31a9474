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
	return a.write(opWrite, p, off, int64(len(p)), false, false)
}

// WriteAtFUA is WriteAt followed by a flush of the members written, so the
// data is durable on every live copy before it returns.
func (a *Array) WriteAtFUA(p []byte, off int64) (int, error) {
	return a.write(opWrite, p, off, int64(len(p)), true, false)
}

// Discard passes a discard of [off, off+length) to the members. The range
// reads back as unspecified data (zeroes on file members).
func (a *Array) Discard(off, length int64) error {
	_, err := a.write(opDiscard, nil, off, length, false, false)
	return err
}

// WriteZeroes makes [off, off+length) read back as zeroes on every copy.
func (a *Array) WriteZeroes(off, length int64) error {
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

func (a *Array) writePiece(op opKind, p []byte, aoff, length int64, fua, raw bool) error {
	c := aoff >> a.geo.chunkShift
	bk, err := a.enter(c)
	if err != nil {
		return err
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
			return err
		}
		if bk, err = a.enter(c); err != nil {
			return err
		}
	}
	defer a.exit(bk)
	bk.wOps.Add(1)
	bk.wBytes.Add(uint64(length))
	region := aoff / a.geo.region
	if err := a.bm.startWrite(region); err != nil {
		return err
	}
	defer a.bm.endWrite(region)
	within := aoff & (a.geo.chunk - 1)
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	s0, s1 := a.slots[d0], a.slots[d1]
	o0 += within
	o1 += within
	r0, r1 := s0.live(), s1.live()
	// in-sync status at submission: only those copies count for the ack.
	sync0 := r0 != nil && MemberState(s0.state.Load()) == MemberInSync
	sync1 := r1 != nil && MemberState(s1.state.Load()) == MemberInSync
	// Copies go to workers where the member deadline can abandon them
	// (deadline.go), and the second copy also when few requests are in
	// flight on members with device latency, so both are written at once.
	// With a queue already, the submitters themselves give the parallelism,
	// and a write that completes in memory (tmpfs, page cache) costs less
	// than the hand-off, so the submitter then writes both in turn.
	ss, rs, os := [2]*slot{s0, s1}, [2]*memberRef{r0, r1}, [2]int64{o0, o1}
	par := r0 != nil && r1 != nil && s0.inflight.Load()+s1.inflight.Load() < a.handoffBelow &&
		min(s0.wlat.Load(), s1.wlat.Load()) >= int64(handoffLatency)
	var reqs [2]*wreq
	var es [2]error
	for k := range rs {
		if rs[k] == nil || !a.rescue(ss[k]) && (k != 1 || !par) {
			continue
		}
		if req := a.reqs.pop(); req != nil {
			req.s, req.ref, req.op, req.p, req.off, req.length, req.fua = ss[k], rs[k], op, p, os[k], length, fua
			a.submit(req)
			reqs[k] = req
		}
	}
	for k := range rs {
		if rs[k] != nil && reqs[k] == nil {
			es[k] = a.memberWrite(ss[k], rs[k], op, p, os[k], length, fua)
		}
	}
	for k := range rs {
		if reqs[k] != nil {
			es[k] = a.await(reqs[k])
		}
	}
	e0, e1 := es[0], es[1]
	// A copy that was recovering at submission counts as well if it is in
	// sync now, before the bucket is left (md's rule: In_sync at completion).
	// The recovery cannot copy this chunk while the write holds the bucket, so
	// if it has finished, it copied this chunk before the write, and the copy
	// holds the write. (Found by TestModel: a recovery ended during a write
	// whose only in-sync copy failed; the write was refused though the
	// recovered copy had taken it.)
	if r0 != nil && e0 == nil && !sync0 {
		sync0 = s0.inSync() == r0
	}
	if r1 != nil && e1 == nil && !sync1 {
		sync1 = s1.inSync() == r1
	}
	// Acknowledge only if some in-sync copy took the write and every copy
	// that did not is durably failed: a copy that errored but could not be
	// failed (the last one of some chunk: broken) still counts as in sync
	// on disk, and a resync after a crash could copy its stale data back.
	ok, lost := false, false
	if r0 != nil {
		if e0 != nil {
			lost = lost || !a.failed(s0, r0, e0, o0, length)
		} else if sync0 {
			ok = true
		}
	}
	if r1 != nil {
		if e1 != nil {
			lost = lost || !a.failed(s1, r1, e1, o1, length)
		} else if sync1 {
			ok = true
		}
	}
	if !ok || lost {
		// The copies may differ now: make them equal again (the region's
		// bit stays set until then, and an unclean Close keeps it).
		a.markResync(region)
		return fmt.Errorf("%w: chunk %d: no in-sync copy took the write, or a copy that missed it could not be failed", ErrIO, c)
	}
	// A write that put data on a copy's bad blocks makes them good there
	// (a discard does not: it leaves the contents unspecified).
	if op != opDiscard {
		if r0 != nil && e0 == nil && r0.bad.Load().overlaps(o0/BlockSize, length/BlockSize) {
			a.clearBad(s0, r0, o0, length)
		}
		if r1 != nil && e1 == nil && r1.bad.Load().overlaps(o1/BlockSize, length/BlockSize) {
			a.clearBad(s1, r1, o1, length)
		}
	}
	return nil
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
