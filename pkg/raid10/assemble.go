package raid10

import (
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// Assemble: an existing array started from its members' superblocks.

// readSuperblocks reads every member's superblock at once and waits up to
// deadline (for ever if it is negative). hung marks the members that did
// not answer by then; their reads go on, each into a buffer of its own.
func readSuperblocks(members []Member, deadline time.Duration) ([]*superblock, []error, []bool) {
	type result struct {
		i   int
		sb  *superblock
		err error
	}
	sbs, errs, hung := make([]*superblock, len(members)), make([]error, len(members)), make([]bool, len(members))
	ch := make(chan result, len(members))
	waiting := 0
	for i, m := range members {
		if m == nil {
			continue
		}
		waiting++
		hung[i] = true
		go func() {
			sb, err := readSuperblock(m)
			ch <- result{i, sb, err}
		}()
	}
	timeout, stop := deadlineTimer(deadline)
	defer stop()
	for ; waiting > 0; waiting-- {
		select {
		case r := <-ch:
			sbs[r.i], errs[r.i], hung[r.i] = r.sb, r.err, false
		case <-timeout:
			for i := range hung {
				if hung[i] {
					klog.ErrorS(errTimedOut, "raid10: member did not answer its superblock read", "member", i, "deadline", deadline)
				}
			}
			return sbs, errs, hung
		}
	}
	return sbs, errs, hung
}

type assembleCand struct {
	pos int
	m   Member
	sb  *superblock
}

// Assemble starts an existing array from its members, in any order (nil
// entries are skipped; a missing slot starts the array degraded). It
// validates the superblocks, lets the freshest event counter decide the
// array's view, starts a stale member's recovery (bitmap-based when its
// events allow) and, after an unclean shutdown, resyncs the regions the
// bitmap marks dirty.
//
// Member I/O is bounded by the member deadline (Options.MemberTimeout) from
// the start. A member whose superblock read does not answer in time is left
// out only if the freshest superblock that was read shows every active or
// recovering slot held by a member that answered with that same event
// count: then the hung member is no live member of the array, and none of
// those that answered can have been failed by an update only it got.
// Otherwise Assemble fails with a MemberError (errno EIO) naming it: leaving
// it out could trust a stale member. A member that hangs on a later
// metadata read or write is failed as at run time (deadline.go).
func Assemble(members []Member, opts AssembleOptions) (*Array, error) {
	deadline := opts.MemberTimeout
	if deadline == 0 {
		deadline = DefaultMemberTimeout
	}
	sbs, errs, hung := readSuperblocks(members, deadline)
	cands, err := assembleCandidates(members, sbs, errs, hung, deadline)
	if err != nil {
		return nil, err
	}
	uuid, ref, err := freshestView(cands, opts.UUID)
	if err != nil {
		return nil, err
	}
	memberRef := ref
	ref, witnessed := fresherWitness(opts.Witnesses, uuid, ref, deadline)
	if err := checkGeometries(cands, ref); err != nil {
		return nil, err
	}
	if err := checkHungLeftOut(cands, ref, hung, deadline); err != nil {
		return nil, err
	}
	bySlot, err := assignSlots(cands, int(ref.raidDisks))
	if err != nil {
		return nil, err
	}
	a := newAssembledArray(ref, uuid, opts.Options)
	a.adoptMembers(bySlot, ref)
	a.distrustDoubtful(bySlot, opts.Doubtful, vouched(cands, opts.Doubtful, witnessed))
	if err := a.checkEveryChunkInSync(); err != nil {
		if ref != memberRef {
			recordStale(bySlot, ref, deadline)
			return nil, fmt.Errorf("%w: %w", ErrWitnessNeeded, err)
		}
		return nil, err
	}
	// From here on a member that hangs is failed at the deadline, as at
	// run time: the monitor runs before the bitmap is read.
	a.startMonitor()
	a.mergeBitmaps()
	if !ref.clean {
		a.resyncDirtyRegions()
	}
	a.metaMu.Lock()
	a.writeSuperblocksLocked(true, false)
	a.metaMu.Unlock()
	if a.stateLocked() == ArrayFailed {
		a.abandonStart()
		return nil, fmt.Errorf("%w: members failed while assembling", ErrTooFewMembers)
	}
	a.start()
	return a, nil
}

// hungMemberError is the error of an assembly refused because member i
// did not answer its superblock read within deadline.
func hungMemberError(i int, deadline time.Duration, why string) error {
	return &MemberError{Member: i, Op: "read superblock", Err: fmt.Errorf("%w: no answer within %v; %s", errTimedOut, deadline, why)}
}

// assembleCandidates pairs every member that answered with its superblock;
// a member whose superblock could not be read fails the assembly, and so
// does a hung one when no member answered.
func assembleCandidates(members []Member, sbs []*superblock, errs []error, hung []bool, deadline time.Duration) ([]assembleCand, error) {
	var cands []assembleCand
	for i, m := range members {
		if m == nil || hung[i] {
			continue
		}
		if errs[i] != nil {
			return nil, &MemberError{Member: i, Op: "read superblock", Err: errs[i]}
		}
		cands = append(cands, assembleCand{pos: i, m: m, sb: sbs[i]})
	}
	for i := range hung {
		if hung[i] && len(cands) == 0 {
			return nil, hungMemberError(i, deadline, "no other member answered")
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("%w: no members given", ErrTooFewMembers)
	}
	return cands, nil
}

// freshestView returns the array's UUID (want, if set, else the first
// candidate's) and the superblock with the highest event count, which
// decides the array's view; every candidate must be of that array.
func freshestView(cands []assembleCand, want [16]byte) ([16]byte, *superblock, error) {
	uuid := cands[0].sb.arrayUUID
	if want != ([16]byte{}) {
		uuid = want
	}
	ref := cands[0].sb
	for _, c := range cands {
		if c.sb.arrayUUID != uuid {
			return uuid, nil, fmt.Errorf("%w: member %d is in array %x, member %d in %x", ErrMixedArrays, c.pos, c.sb.arrayUUID, cands[0].pos, uuid)
		}
		if c.sb.events > ref.events {
			ref = c.sb
		}
	}
	return uuid, ref, nil
}

// fresherWitness returns the superblock of the witness (AssembleOptions.Witnesses) of
// array uuid with the highest event count above ref's, or ref when none is fresher, and
// the highest event count of the witnesses read (0: none).
func fresherWitness(witnesses []Member, uuid [16]byte, ref *superblock, deadline time.Duration) (*superblock, uint64) {
	if len(witnesses) == 0 {
		return ref, 0
	}
	var seen uint64
	sbs, errs, hung := readSuperblocks(witnesses, deadline)
	for i, sb := range sbs {
		switch {
		case hung[i] || errs[i] != nil:
			klog.InfoS("raid10: witness superblock unreadable; ignored", "witness", i, "err", errs[i], "hung", hung[i])
		case sb.arrayUUID != uuid:
			klog.InfoS("raid10: witness of another array; ignored", "witness", i)
		default:
			seen = max(seen, sb.events)
			if sb.events > ref.events {
				klog.InfoS("raid10: a witness saw later updates than every member; its view decides", "witness", i, "events", sb.events, "memberEvents", ref.events)
				ref = sb
			}
		}
	}
	return ref, seen
}

// vouched is the highest event count seen by a member that is not doubtful
// (AssembleOptions.Doubtful) or by a witness: the views that can vouch for a
// doubtful member.
func vouched(cands []assembleCand, doubtful []bool, witnessed uint64) uint64 {
	v := witnessed
	for _, c := range cands {
		if c.pos >= len(doubtful) || !doubtful[c.pos] {
			v = max(v, c.sb.events)
		}
	}
	return v
}

// distrustDoubtful makes every doubtful member (AssembleOptions.Doubtful) that adoptMembers
// put in sync, that no view of at least its events vouches for, and that has an absent
// mirror partner, stale: rebuilt in full from a partner, or, with none in sync, the
// assembly fails (checkEveryChunkInSync). With every partner present the freshest view
// decides as always: it knows whether the member missed writes.
func (a *Array) distrustDoubtful(bySlot []*assembleCand, doubtful []bool, vouched uint64) {
	for i, c := range bySlot {
		if c == nil || c.pos >= len(doubtful) || !doubtful[c.pos] || c.sb.events <= vouched && vouched > 0 {
			continue
		}
		s := a.slots[i]
		if MemberState(s.state.Load()) != MemberInSync {
			continue
		}
		partnerAway := false
		for _, p := range a.geo.pairs() {
			for k, slot := range p {
				if slot == i && bySlot[p[1-k]] == nil {
					partnerAway = true
				}
			}
		}
		if !partnerAway {
			continue
		}
		s.fullSync, s.recovered = true, 0
		s.ref.Load().bad.Store(nil) // every block is rewritten or recorded again
		s.state.Store(int32(MemberRecovering))
		klog.InfoS("raid10: doubtful member with a mirror partner absent and no view vouching for it: not trusted as in sync", "member", i, "events", c.sb.events, "vouched", vouched)
	}
}

// recordStale writes into each member of bySlot that the witness's view ref does not count
// as in sync a superblock of that view in which the member is recovering from its start:
// the witness's knowledge outlives the witness (its disk may be replaced and leave for
// good), so the stale member alone is refused at every later assembly, while the member
// the witness sits on, back in the array, still counts as in sync and rebuilds it. Only an
// assembly that fails writes this: one that starts records the members' states itself.
// A write that fails or does not finish within deadline is logged; the assembly fails
// either way.
func recordStale(bySlot []*assembleCand, ref *superblock, deadline time.Duration) {
	for i, c := range bySlot {
		if c == nil || c.sb.recoveryOff == recoveryDone && ref.slots[i] == slotActive {
			continue // in sync
		}
		if c.sb.events == ref.events && c.sb.recoveryOff != recoveryDone && c.sb.slots[i] == slotRecovering {
			continue // recorded already
		}
		sb := *ref
		sb.role, sb.memberUUID, sb.bad = c.sb.role, c.sb.memberUUID, c.sb.bad
		sb.recoveryOff, sb.partial = 0, false
		sb.slots[i] = slotRecovering
		sb.seq = c.sb.seq + 1
		buf := AlignedBuffer(sbSize) // not shared: an abandoned write may still read it
		sb.marshal(buf)
		off := int64(sbCopyA)
		if sb.seq&1 == 1 {
			off = sbCopyB
		}
		done := make(chan error, 1)
		go func() {
			_, err := c.m.WriteAt(buf, off)
			if err == nil {
				err = c.m.Flush()
			}
			done <- err
		}()
		timeout, stop := deadlineTimer(deadline)
		var err error
		select {
		case err = <-done:
		case <-timeout:
			err = errTimedOut
		}
		stop()
		if err != nil {
			klog.ErrorS(err, "raid10: recording a stale member in its superblock", "member", i)
			continue
		}
		klog.InfoS("raid10: member recorded stale: a witness saw writes it missed; it recovers when the witness's member is back", "member", i, "events", ref.events)
	}
}

// checkGeometries checks every candidate's geometry against the freshest
// view's, and that each member is large enough for it.
func checkGeometries(cands []assembleCand, ref *superblock) error {
	for _, c := range cands {
		s := c.sb
		// A member whose superblock is older may predate a Grow that a
		// crash interrupted: its sizes may then be smaller than the
		// freshest view's, never larger (Grow zeroes the new range on
		// every member before any superblock records it).
		sameSizes := s.dataSize == ref.dataSize && s.arraySize == ref.arraySize && s.bitmapBytes == ref.bitmapBytes
		grown := s.events < ref.events && s.dataSize <= ref.dataSize && s.arraySize <= ref.arraySize && s.bitmapBytes <= ref.bitmapBytes
		if s.raidDisks != ref.raidDisks || s.chunkSize != ref.chunkSize || s.dataOffset != ref.dataOffset ||
			s.regionSize != ref.regionSize || s.layout != ref.layout || !sameSizes && !grown {
			return fmt.Errorf("%w: member %d", ErrGeometryMismatch, c.pos)
		}
		if c.m.Size() < int64(ref.dataOffset+ref.dataSize) {
			return fmt.Errorf("%w: member %d has %d bytes, the array needs %d", ErrMemberTooSmall, c.pos, c.m.Size(), ref.dataOffset+ref.dataSize)
		}
	}
	return nil
}

// checkHungLeftOut lets the assembly go on without the hung members only
// if every active or recovering slot of the freshest view is held by a
// member that answered with the latest event count (see Assemble).
func checkHungLeftOut(cands []assembleCand, ref *superblock, hung []bool, deadline time.Duration) error {
	for i := range hung {
		if !hung[i] {
			continue
		}
		for slot := range int(ref.raidDisks) {
			if st := ref.slots[slot]; st != slotActive && st != slotRecovering {
				continue
			}
			held := false
			for _, c := range cands {
				held = held || int(c.sb.role) == slot && c.sb.events == ref.events
			}
			if !held {
				return hungMemberError(i, deadline, fmt.Sprintf("live slot %d has no member that answered with the latest events, and the hung member may be the only one that knows of a later failure", slot))
			}
		}
		klog.InfoS("raid10: member did not answer its superblock read in time; left out, every live slot is held by members that answered", "member", i, "deadline", deadline)
	}
	return nil
}

// assignSlots gives each of the n slots the candidate with the freshest
// superblock claiming it (nil: none); two with the same event count for
// one slot fail the assembly.
func assignSlots(cands []assembleCand, n int) ([]*assembleCand, error) {
	bySlot := make([]*assembleCand, n)
	for i := range cands {
		c := &cands[i]
		prev := bySlot[c.sb.role]
		switch {
		case prev == nil || c.sb.events > prev.sb.events:
			bySlot[c.sb.role] = c
		case c.sb.events == prev.sb.events:
			return nil, fmt.Errorf("%w: members %d and %d both claim slot %d", ErrDuplicateRole, prev.pos, c.pos, c.sb.role)
		}
	}
	return bySlot, nil
}

// newAssembledArray is the (not yet started) array of the freshest view.
func newAssembledArray(ref *superblock, uuid [16]byte, opts Options) *Array {
	geo := newGeometry(int(ref.raidDisks), int64(ref.chunkSize), int64(ref.dataOffset), int64(ref.dataSize), int64(ref.arraySize), int64(ref.regionSize), int64(ref.bitmapBytes))
	a := newArray(geo, uuid, opts)
	a.ctime = ref.ctime
	a.events.Store(ref.events)
	a.eventsCleared = ref.eventsCleared
	a.liveCopies, a.copyGen = ref.liveCopies, ref.copyGen
	return a
}

// adoptMembers puts each slot's member in, in sync or recovering as the
// freshest view and its own superblock say.
func (a *Array) adoptMembers(bySlot []*assembleCand, ref *superblock) {
	for i, c := range bySlot {
		if c == nil {
			continue
		}
		s := a.slots[i]
		mr := newRef(c.m, c.sb.memberUUID)
		mr.bad.Store(newBadList(c.sb.bad))
		s.ref.Store(mr)
		s.sbSeq = c.sb.seq
		// The freshest slot table decides: a member it calls active got
		// every acknowledged write (a failure to write it would have failed
		// it, or, for a last copy, failed the write), even if it missed the
		// last superblock updates. Copies that may differ are in dirty
		// bitmap regions, which an unclean start resyncs.
		fresh := c.sb.recoveryOff == recoveryDone && ref.slots[i] == slotActive
		switch {
		case fresh:
			s.state.Store(int32(MemberInSync))
			if c.sb.events != ref.events {
				klog.InfoS("raid10: member missed superblock updates but is in sync", "member", i, "events", c.sb.events, "arrayEvents", ref.events)
			}
		case c.sb.recoveryOff != recoveryDone && ref.slots[i] == slotRecovering && c.sb.events == ref.events:
			// A recovery that was running to the end: it resumes where its
			// last checkpoint says; after an unclean stop it also redoes
			// the dirty regions it had done (writes in flight at the crash
			// may have reached only one copy).
			s.fullSync = !c.sb.partial
			s.recovered = int64(min(c.sb.recoveryOff, c.sb.dataSize))
			s.redoDirty = !ref.clean
			s.state.Store(int32(MemberRecovering))
			klog.InfoS("raid10: interrupted recovery resumes", "member", i, "rebuiltBytes", s.recovered, "full", s.fullSync)
		default:
			s.fullSync = c.sb.recoveryOff != recoveryDone || c.sb.events < ref.eventsCleared
			if s.fullSync {
				mr.bad.Store(nil) // every block is rewritten or recorded again
			}
			s.state.Store(int32(MemberRecovering))
			klog.InfoS("raid10: stale member needs recovery", "member", i, "events", c.sb.events, "arrayEvents", ref.events, "full", s.fullSync)
		}
	}
}

// checkEveryChunkInSync fails the assembly if some pair of slots has no
// in-sync member: its chunks have no copy.
func (a *Array) checkEveryChunkInSync() error {
	var missing []int
	for _, p := range a.geo.pairs() {
		if a.slots[p[0]].inSync() == nil && a.slots[p[1]].inSync() == nil {
			missing = append(missing, p[0], p[1])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: no in-sync member among slots %v", ErrTooFewMembers, missing)
	}
	return nil
}

// mergeBitmaps loads the bitmap of every in-sync member (the union of
// their dirty regions) and writes the merged one to every live member.
func (a *Array) mergeBitmaps() {
	bad := 0
	for _, s := range a.slots {
		if r := s.inSync(); r != nil {
			bad += a.bm.load(r)
		}
	}
	if bad > 0 {
		klog.InfoS("raid10: corrupt bitmap blocks treated as dirty", "blocks", bad)
	}
	// Every live member gets the merged bitmap, so that any of them can
	// later be the one an assembly reads it from.
	a.bm.mu.Lock()
	if err := a.bm.writeAll(); err != nil {
		klog.ErrorS(err, "raid10: writing the merged bitmap at assembly failed")
	}
	a.bm.mu.Unlock()
}

// resyncDirtyRegions marks every dirty bitmap region for resync, after an
// unclean shutdown.
func (a *Array) resyncDirtyRegions() {
	dirty := a.bm.dirtyRegions()
	for _, r := range dirty {
		a.resyncNeed()[r>>6].Or(1 << (r & 63))
	}
	if len(dirty) > 0 {
		a.resyncActive.Store(true)
		klog.InfoS("raid10: unclean shutdown, resyncing dirty regions", "regions", len(dirty))
	}
}
