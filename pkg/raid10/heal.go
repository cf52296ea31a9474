package raid10

import "k8s.io/klog/v2"

// syncMode says what syncRange does with the copies of a range.
type syncMode int

const (
	// modeRead serves a foreground read after an error or onto a bad
	// block: p gets the data, and a copy that failed to read or is marked
	// bad is rewritten from the good one (under the bitmap, as a write).
	modeRead syncMode = iota
	// modeResync makes the second in-sync copy equal to the first (block by
	// block from whichever copy is readable where the first is not).
	modeResync
	// modeRecover writes the recovery targets from the in-sync copy.
	modeRecover
)

// copyState is what syncRange knows of one copy of the range.
type copyState struct {
	s      *slot
	in     *memberRef // in sync: a source, and rewritten where bad
	target *memberRef // recovering target (modeRecover)
	off    int64      // member byte offset of the range
	bad    []badRange // blocks to record bad (no copy had them)
	wrote  []badRange // marked blocks a write put valid data over
	errs   bool       // some read of this copy failed
}

// addRun appends blocks [b, b+n) to rs, merging with the last run.
func addRun(rs []badRange, b, n int64) []badRange {
	if k := len(rs); k > 0 && rs[k-1].start+rs[k-1].count == b {
		rs[k-1].count += n
		return rs
	}
	return append(rs, badRange{b, n})
}

// syncRange reads, heals and copies bytes [within, within+len(p)) of chunk
// c. The caller has raised the chunk's barrier, so no write races it.
//
// Each block comes from the first in-sync copy that is not marked bad and
// reads without error; the other copy is then written with it where mode
// asks (a recovery target always; in modeResync every in-sync copy; in
// modeRead a copy that failed to read or is marked). A block that no copy
// delivers is recorded bad on every copy (in-sync and target), p gets
// zeroes there, and it is counted in the result: reads of it fail with
// EIO from then on, other blocks are unaffected. The whole range is tried
// in one read first; block by block only after an error or where marks
// are. complete is false if a copy that stays in sync could not be written.
func (a *Array) syncRange(c, within int64, p []byte, mode syncMode, targets map[*slot]*memberRef) (lost int64, complete bool) {
	rs := a.newRangeSync(c, within, p, mode, targets)
	if mode == modeRead {
		rs.holdRegion()
		defer rs.releaseRegion()
	}
	if !rs.copyWhole() {
		rs.copyBlocks()
	}
	rs.settleUnreadable()
	rs.recordMarks()
	return rs.lost, rs.complete
}

// rangeSync is one syncRange call: the range, its two copies and what was
// found so far.
type rangeSync struct {
	a           *Array
	c, within   int64
	p           []byte
	n           int64 // blocks in p
	mode        syncMode
	cp          [2]copyState
	region      int64 // modeRead: the bitmap region held for rewrites, -1 none
	unavailable bool  // an in-sync copy is past its deadline
	lost        int64
	complete    bool
}

// newRangeSync finds the range's two copies: in sync, a recovery target,
// or neither.
func (a *Array) newRangeSync(c, within int64, p []byte, mode syncMode, targets map[*slot]*memberRef) *rangeSync {
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	rs := &rangeSync{a: a, c: c, within: within, p: p, n: int64(len(p)) / BlockSize, mode: mode, region: -1, complete: true,
		cp: [2]copyState{{s: a.slots[d0], off: o0 + within}, {s: a.slots[d1], off: o1 + within}}}
	for k := range rs.cp {
		cs := &rs.cp[k]
		cs.in = cs.s.inSync()
		if cs.in != nil && cs.in.timedOut.Load() {
			// Past its deadline: not read, not written, not marked. Its
			// blocks may be fine; they are just not available now.
			cs.in, rs.unavailable = nil, true
		}
		if tr, ok := targets[cs.s]; ok && cs.s.ref.Load() == tr && MemberState(cs.s.state.Load()) == MemberRecovering {
			cs.target = tr
		}
	}
	if rs.unavailable && mode == modeResync {
		rs.complete = false // the hung copy cannot be made equal now
	}
	return rs
}

// holdRegion takes the range's bitmap region as a write does, so that a
// copy that failed to read can be rewritten (modeRead).
func (rs *rangeSync) holdRegion() {
	rs.region = (rs.c<<rs.a.geo.chunkShift + rs.within) / rs.a.geo.region
	if err := rs.a.bm.startWrite(rs.region); err != nil {
		rs.region = -1 // no rewrite without the bit; reads still served
	}
}

// releaseRegion ends holdRegion.
func (rs *rangeSync) releaseRegion() {
	if rs.region >= 0 {
		rs.a.bm.endWrite(rs.region)
	}
}

// needs reports whether copy j is written with data read from the other.
func (rs *rangeSync) needs(j int, readFailed bool, blk, cnt int64) bool {
	cs := &rs.cp[j]
	switch {
	case cs.target != nil:
		return true
	case cs.in == nil:
		return false
	case rs.mode == modeResync:
		return true
	case rs.mode == modeRead && rs.region < 0:
		return false
	}
	return readFailed || cs.in.bad.Load().overlaps(blk, cnt)
}

// write writes q at member offset off of copy j: a recovery target that
// fails is failed; an in-sync copy that fails is failed, or the range is
// incomplete if it stays in sync.
func (rs *rangeSync) write(j int, q []byte, off int64) {
	a, cs := rs.a, &rs.cp[j]
	if cs.target != nil {
		if err := a.rescuedIO(cs.s, cs.target, opWrite, q, off); err != nil {
			a.memberFailed(cs.s, cs.target, "recovery write", err)
			cs.target = nil
			rs.complete = false
			return
		}
		if cs.target.bad.Load().overlaps(off/BlockSize, int64(len(q))/BlockSize) {
			cs.wrote = addRun(cs.wrote, off/BlockSize, int64(len(q))/BlockSize)
		}
		return
	}
	if err := a.rescuedIO(cs.s, cs.in, opWrite, q, off); err != nil {
		if !a.failed(cs.s, cs.in, err, off, int64(len(q))) {
			rs.complete = false // still in sync, and it missed the data
		}
		cs.in = nil
		return
	}
	if cs.in.bad.Load().overlaps(off/BlockSize, int64(len(q))/BlockSize) {
		cs.wrote = addRun(cs.wrote, off/BlockSize, int64(len(q))/BlockSize)
	}
}

// copyWhole reads the whole range from the first clean in-sync copy and
// writes the other copy where it needs it; false if no copy delivered it
// in one read.
//
// While the copies may differ (an unclean shutdown's dirty region not
// resynced yet), reads and the resync take each block from the first
// copy where it can be read, so a block never changes its value under
// a reader; only then may the whole range come from the second copy.
func (rs *rangeSync) copyWhole() bool {
	a := rs.a
	firstOnly := rs.mode == modeResync ||
		a.resyncActive.Load() && a.regionNeedsResync((rs.c<<a.geo.chunkShift+rs.within)/a.geo.region)
	for k := range rs.cp {
		if k == 1 && firstOnly {
			break
		}
		cs := &rs.cp[k]
		r := cs.in
		if r == nil || r.bad.Load().overlaps(cs.off/BlockSize, rs.n) {
			continue
		}
		if err := a.rescuedIO(cs.s, r, opRead, rs.p, cs.off); err != nil {
			cs.s.readErrs.Add(1)
			klog.V(2).InfoS("raid10: read error, going block by block", "member", cs.s.idx, "chunk", rs.c, "err", err)
			return false
		}
		if j := 1 - k; rs.needs(j, false, rs.cp[j].off/BlockSize, rs.n) {
			rs.write(j, rs.p, rs.cp[j].off)
		}
		return true
	}
	return false
}

// copyBlocks goes block by block: each from the first copy that reads it,
// written to the other where it needs it; a block no copy delivers is
// zeroed in p, counted lost and queued to be recorded bad on every copy.
func (rs *rangeSync) copyBlocks() {
	a, cp := rs.a, &rs.cp
	for i := int64(0); i < rs.n; i++ {
		q := rs.p[i*BlockSize : (i+1)*BlockSize]
		got := -1
		var failed [2]bool
		for k := range cp {
			r := cp[k].in
			if r == nil || r.bad.Load().has(cp[k].off/BlockSize+i) {
				continue
			}
			if err := a.rescuedIO(cp[k].s, r, opRead, q, cp[k].off+i*BlockSize); err != nil {
				cp[k].s.readErrs.Add(1)
				failed[k] = true
				cp[k].errs = true
				continue
			}
			got = k
			break
		}
		if got < 0 {
			rs.lost++
			clear(q)
			if rs.unavailable {
				// The copy that may hold it is hung: nothing is marked;
				// a recovery cannot go on without it (settleUnreadable).
				rs.complete = false
				continue
			}
			for k := range cp {
				if cp[k].in != nil || cp[k].target != nil {
					cp[k].bad = addRun(cp[k].bad, cp[k].off/BlockSize+i, 1)
				}
			}
			continue
		}
		if j := 1 - got; rs.needs(j, failed[j], cp[j].off/BlockSize+i, 1) {
			rs.write(j, q, cp[j].off+i*BlockSize)
		}
	}
}

// settleUnreadable handles lost blocks whose copy is hung or whose device
// fails as a whole: nothing is recorded bad then.
//
// A copy whose reads failed may be a device failing as a whole (gone,
// dead controller), not some sectors: it is failed (or broken, if it
// holds a last copy), and nothing is recorded bad on any copy, since
// the blocks may read fine when it returns. Probed before any mark.
func (rs *rangeSync) settleUnreadable() {
	a, cp := rs.a, &rs.cp
	failing := false
	if rs.lost > 0 && !rs.unavailable {
		for k := range cp {
			if cs := &cp[k]; cs.errs && cs.in != nil && !a.mediaError(cs.s, cs.in) {
				a.memberFailed(cs.s, cs.in, "read", errDeviceFailing)
				failing = true
			}
		}
	}
	if (!rs.unavailable && !failing) || rs.lost == 0 {
		return
	}
	rs.complete = false
	if rs.mode == modeRecover {
		// The only source is hung or failing: the targets cannot get
		// this chunk, and marking it bad on them would lose data the
		// source may still hold (after a crash or restart it is the
		// in-sync copy again). They are failed instead (as md stops a
		// recovery without a source); a re-add after the source is
		// back rebuilds them (TestSourceGoneDuringRecovery).
		var why error = errTimedOut
		if failing {
			why = errDeviceFailing
		}
		for k := range cp {
			if cp[k].target != nil {
				a.memberFailed(cp[k].s, cp[k].target, "recovery", why)
			}
		}
	}
	for k := range cp {
		cp[k].bad = nil
	}
}

// recordMarks clears the bad marks the writes put valid data over and
// records bad the blocks no copy delivered.
func (rs *rangeSync) recordMarks() {
	a := rs.a
	for k := range rs.cp {
		cs := &rs.cp[k]
		r := cs.in
		if r == nil {
			r = cs.target
		}
		if r == nil {
			continue
		}
		for _, w := range cs.wrote {
			a.clearBad(cs.s, r, w.start*BlockSize, w.count*BlockSize)
		}
		for _, br := range cs.bad {
			// A full list fails the member (or breaks it if it holds the
			// last copy of some chunk): recordBad reports it.
			klog.ErrorS(nil, "raid10: blocks without a good copy recorded bad", "member", cs.s.idx, "block", br.start, "count", br.count, "chunk", rs.c)
			a.recordBad(cs.s, r, br.start*BlockSize, br.count*BlockSize)
		}
	}
}

// mediaError tells a localized media error from a device that fails as a
// whole: after read errors on r, its superblock is read back. If that
// fails too, the device is failing (or gone), and its blocks must not be
// recorded bad: they may read fine when it returns.
func (a *Array) mediaError(s *slot, r *memberRef) bool {
	if r.timedOut.Load() {
		return false
	}
	// Not from the bounce pools: an abandoned probe (deadline.go) may
	// still read into it after this returns, and a pooled buffer would by
	// then carry another request's data.
	b := AlignedBuffer(sbSize)
	a.metaMu.Lock() // no superblock write races the probe
	err := a.metaIO(r, func() error { _, err := r.m.ReadAt(b, sbCopyA); return err })
	a.metaMu.Unlock()
	if err != nil {
		klog.ErrorS(err, "raid10: member fails as a whole after read errors", "member", s.idx)
	}
	return err == nil
}
