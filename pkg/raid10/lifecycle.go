package raid10

import (
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

func newUUID() [16]byte {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

func roundUp(v, to int64) int64 { return (v + to - 1) / to * to }

// Create writes fresh metadata to every member and returns the running
// array. Members are slots 0..N-1 in order; N >= 2 (odd counts are fine).
// Without opts.AssumeClean the whole array is resynced in the background
// (reads stay correct meanwhile: they use the first copy).
//
// The metadata writes are bounded by the member deadline
// (Options.MemberTimeout): a member that hangs or fails makes Create fail
// with a MemberError naming it (errno EIO), and the superblocks written to
// the members that answered are wiped, so no later Assemble trusts them.
func Create(members []Member, opts CreateOptions) (*Array, error) {
	n := len(members)
	if n < 2 {
		return nil, fmt.Errorf("%w: %d members, need at least 2", ErrTooFewMembers, n)
	}
	if n > MaxMembers {
		return nil, invalidf("%d members, at most %d", n, MaxMembers)
	}
	chunk := opts.ChunkSize
	if chunk == 0 {
		chunk = DefaultChunkSize
	}
	if chunk < BlockSize || chunk&(chunk-1) != 0 || chunk > 1<<30 {
		return nil, invalidf("chunk size %d is not a power of two in [4 KiB, 1 GiB]", chunk)
	}
	region := opts.RegionSize
	if region == 0 {
		region = roundUp(max(DefaultRegionSize, chunk), chunk)
	}
	if region <= 0 || region%chunk != 0 {
		return nil, invalidf("region size %d is not a multiple of the chunk size %d", region, chunk)
	}
	minSize := int64(-1)
	for i, m := range members {
		if m == nil {
			return nil, invalidf("member %d is nil", i)
		}
		if s := m.Size(); minSize < 0 || s < minSize {
			minSize = s
		}
	}
	regionsMax := (minSize*int64(n)/nearCopies + region - 1) / region
	bmBytes := max(1, (regionsMax+bmBitsPerBlock-1)/bmBitsPerBlock) * sbSize
	dataOffset := roundUp(bitmapOffset+bmBytes, dataAlign)
	if minSize < dataOffset+chunk {
		return nil, fmt.Errorf("%w: %d bytes, need at least %d", ErrMemberTooSmall, minSize, dataOffset+chunk)
	}
	devChunks := (minSize - dataOffset) / chunk
	capacity := capacityChunks(n, devChunks) * chunk
	size := capacity
	if opts.Size != 0 {
		if opts.Size < 0 || opts.Size%BlockSize != 0 || opts.Size > capacity {
			return nil, invalidf("size %d: must be a multiple of %d and at most %d", opts.Size, BlockSize, capacity)
		}
		size = opts.Size
	}
	geo := newGeometry(n, chunk, dataOffset, devChunks*chunk, size, region, bmBytes)
	uuid := opts.UUID
	if uuid == ([16]byte{}) {
		uuid = newUUID()
	}
	a := newArray(geo, uuid, opts.Options)
	a.ctime = uint64(time.Now().UnixNano())
	for i, m := range members {
		s := a.slots[i]
		s.ref.Store(newRef(m, newUUID()))
		s.state.Store(int32(MemberInSync))
	}
	if !opts.AssumeClean {
		a.bm.setAll()
		for r := int64(0); r < geo.regions; r++ {
			a.resyncNeed()[r>>6].Or(1 << (r & 63))
		}
		a.resyncActive.Store(true)
	}
	// The metadata writes are under the deadline: a member that hangs is
	// failed by the monitor and Create fails naming it.
	a.startMonitor()
	a.bm.mu.Lock()
	err := a.bm.writeAll()
	a.bm.mu.Unlock()
	if err == nil {
		a.metaMu.Lock()
		a.writeSuperblocksLocked(false, false)
		a.writeSuperblocksLocked(true, false) // both copies valid from the start
		a.metaMu.Unlock()
	}
	if bad := a.createFailed(err); bad != nil {
		return nil, bad
	}
	a.start()
	klog.V(1).InfoS("raid10: created", "members", n, "size", size, "chunk", chunk, "region", region)
	return a, nil
}

// createFailed reports why a Create failed (err, the bitmap write's error,
// or a member that is no longer in sync: a MemberError naming the first
// one, matching EIO), or nil if it did not. On failure it abandons the
// array and wipes both superblock copies of the members that answered, so
// that an assembly of the members fails (no superblock) instead of
// trusting a half-created array. A member that hung gets no wipe: it does
// not answer. Its superblock is normally unwritten (the bitmap, written
// first, or its superblock write hung); one whose superblock landed but
// whose flush hung keeps a superblock of an array holding no data.
func (a *Array) createFailed(err error) error {
	members := make([]Member, len(a.slots))
	hung := make([]bool, len(a.slots))
	var named error
	for i, s := range a.slots {
		r := s.ref.Load()
		members[i], hung[i] = r.m, r.timedOut.Load()
		if named != nil || MemberState(s.state.Load()) == MemberInSync && !s.broken.Load() {
			continue
		}
		cause := fmt.Errorf("%w: a metadata write or flush failed", ErrIO)
		if hung[i] {
			cause = fmt.Errorf("%w: no answer within %v", errTimedOut, a.timeout())
		}
		named = &MemberError{Member: i, Op: "create", Err: cause}
	}
	if named == nil && err == nil {
		return nil
	}
	if named == nil {
		named = err
	}
	klog.ErrorS(named, "raid10: create failed; wiping the superblocks written")
	a.abandonStart()
	wipeSuperblocks(members, hung, a.timeout())
	return named
}

// wipeSuperblocks zeroes both superblock copies of each member not marked
// skip and flushes it, all at once, waiting up to deadline (for ever if it
// is not positive); a member that does not answer in time is logged and
// left (its wipe goes on, from a buffer of its own).
func wipeSuperblocks(members []Member, skip []bool, deadline time.Duration) {
	ch := make(chan struct{}, len(members))
	waiting := 0
	for i, m := range members {
		if m == nil || skip[i] {
			continue
		}
		waiting++
		go func() {
			defer func() { ch <- struct{}{} }()
			_, err := m.WriteAt(AlignedBuffer(2*sbSize), sbCopyA)
			if err == nil {
				err = m.Flush()
			}
			if err != nil {
				klog.ErrorS(err, "raid10: wiping a superblock failed", "member", i)
			}
		}()
	}
	var timeout <-chan time.Time
	if deadline > 0 {
		t := time.NewTimer(deadline)
		defer t.Stop()
		timeout = t.C
	}
	for ; waiting > 0; waiting-- {
		select {
		case <-ch:
		case <-timeout:
			klog.ErrorS(errTimedOut, "raid10: a superblock wipe did not answer in time", "deadline", deadline)
			return
		}
	}
}

// writeSuperblocksLocked writes the superblock of every live member (the
// copy the member's sequence number selects, A or B alternately) and then
// flushes each: the durability order is data, bitmap, superblock. Slots
// marked failing are recorded as faulty and get no superblock; a member
// whose write or flush fails becomes failing and the others are written
// again. Only when the table is durable do failing slots turn Faulty (and
// writes stop going to them). Caller holds metaMu.
func (a *Array) writeSuperblocksLocked(bump, clean bool) {
	if bump {
		a.events++
	}
	recorded := false // the table reached some member durably
	for attempt := 0; attempt <= len(a.slots); attempt++ {
		failed := false
		var sb superblock
		sb.clean = clean
		sb.arrayUUID = a.uuid
		sb.raidDisks = uint32(a.geo.n)
		sb.layout = nearCopies
		sb.chunkSize = uint32(a.geo.chunk)
		sb.dataOffset = uint64(a.geo.dataOffset)
		sb.dataSize = uint64(a.geo.dataSize)
		sb.arraySize = uint64(a.geo.size)
		sb.events = a.events
		sb.bitmapOffset = bitmapOffset
		sb.bitmapBytes = uint64(a.geo.bmBytes)
		sb.regionSize = uint64(a.geo.region)
		sb.eventsCleared = a.eventsCleared
		sb.liveCopies, sb.copyGen = a.liveCopies, a.copyGen
		sb.ctime = a.ctime
		for i, s := range a.slots {
			switch {
			case s.failing.Load():
				sb.slots[i] = slotFaulty
			case MemberState(s.state.Load()) == MemberInSync:
				sb.slots[i] = slotActive
			case MemberState(s.state.Load()) == MemberRecovering:
				sb.slots[i] = slotRecovering
			case MemberState(s.state.Load()) == MemberFaulty:
				sb.slots[i] = slotFaulty
			default:
				sb.slots[i] = slotMissing
			}
		}
		fail := func(s *slot, what string, err error) {
			klog.ErrorS(err, "raid10: superblock "+what+" failed", "member", s.idx)
			s.writeErrs.Add(1)
			if a.canFailLocked(s) {
				s.failing.Store(true)
				failed = true
			} else {
				s.broken.Store(true)
			}
		}
		var written [MaxMembers]*memberRef
		for i, s := range a.slots {
			r := s.live()
			if r == nil || s.failing.Load() {
				continue
			}
			sb.role = uint32(i)
			sb.memberUUID = r.uuid
			sb.recoveryOff = recoveryDone
			sb.partial = false
			if MemberState(s.state.Load()) != MemberInSync {
				sb.recoveryOff = uint64(s.recovered)
				sb.partial = !s.fullSync
			}
			sb.bad = r.bad.Load().ranges()
			s.sbSeq++
			sb.seq = s.sbSeq
			buf := AlignedBuffer(sbSize) // not shared: an abandoned write may still read it
			sb.marshal(buf)
			off := int64(sbCopyA)
			if s.sbSeq&1 == 1 {
				off = sbCopyB
			}
			if err := a.metaIO(r, func() error { _, err := r.m.WriteAt(buf, off); return err }); err != nil {
				fail(s, "write", err)
				continue
			}
			written[i] = r
		}
		for i, s := range a.slots {
			if written[i] == nil {
				continue
			}
			r := written[i]
			if err := a.metaIO(r, r.m.Flush); err != nil {
				fail(s, "flush", err)
			}
		}
		durable := false
		for i := range a.slots {
			if written[i] != nil && !a.slots[i].failing.Load() && !a.slots[i].broken.Load() {
				durable = true
			}
		}
		if !failed || !durable {
			recorded = durable
			break
		}
		a.events++
	}
	for _, s := range a.slots {
		if !s.failing.Load() {
			continue
		}
		if recorded {
			s.state.Store(int32(MemberFaulty))
			s.broken.Store(false) // out of the array now: nothing of it counts
			if r := s.ref.Load(); r != nil {
				r.kill() // waiters on its calls give up on it
			}
		} else {
			// No member holds the record: after a crash this member would
			// come back in sync, so it must stay in the array, broken.
			s.broken.Store(true)
		}
		s.failing.Store(false)
	}
}

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
	var timeout <-chan time.Time
	if deadline > 0 {
		t := time.NewTimer(deadline)
		defer t.Stop()
		timeout = t.C
	}
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
	hungErr := func(i int, why string) error {
		return &MemberError{Member: i, Op: "read superblock", Err: fmt.Errorf("%w: no answer within %v; %s", errTimedOut, deadline, why)}
	}
	for i := range hung {
		if hung[i] && len(cands) == 0 {
			return nil, hungErr(i, "no other member answered")
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("%w: no members given", ErrTooFewMembers)
	}
	uuid := cands[0].sb.arrayUUID
	if opts.UUID != ([16]byte{}) {
		uuid = opts.UUID
	}
	ref := cands[0].sb
	for _, c := range cands {
		if c.sb.arrayUUID != uuid {
			return nil, fmt.Errorf("%w: member %d is in array %x, member %d in %x", ErrMixedArrays, c.pos, c.sb.arrayUUID, cands[0].pos, uuid)
		}
		if c.sb.events > ref.events {
			ref = c.sb
		}
	}
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
			return nil, fmt.Errorf("%w: member %d", ErrGeometryMismatch, c.pos)
		}
		if c.m.Size() < int64(ref.dataOffset+ref.dataSize) {
			return nil, fmt.Errorf("%w: member %d has %d bytes, the array needs %d", ErrMemberTooSmall, c.pos, c.m.Size(), ref.dataOffset+ref.dataSize)
		}
	}
	n := int(ref.raidDisks)
	for i := range hung {
		if !hung[i] {
			continue
		}
		for slot := range n {
			if st := ref.slots[slot]; st != slotActive && st != slotRecovering {
				continue
			}
			held := false
			for _, c := range cands {
				held = held || int(c.sb.role) == slot && c.sb.events == ref.events
			}
			if !held {
				return nil, hungErr(i, fmt.Sprintf("live slot %d has no member that answered with the latest events, and the hung member may be the only one that knows of a later failure", slot))
			}
		}
		klog.InfoS("raid10: member did not answer its superblock read in time; left out, every live slot is held by members that answered", "member", i, "deadline", deadline)
	}
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
	geo := newGeometry(n, int64(ref.chunkSize), int64(ref.dataOffset), int64(ref.dataSize), int64(ref.arraySize), int64(ref.regionSize), int64(ref.bitmapBytes))
	a := newArray(geo, uuid, opts.Options)
	a.ctime = ref.ctime
	a.events = ref.events
	a.eventsCleared = ref.eventsCleared
	a.liveCopies, a.copyGen = ref.liveCopies, ref.copyGen
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
	var missing []int
	for _, p := range geo.pairs() {
		if a.slots[p[0]].inSync() == nil && a.slots[p[1]].inSync() == nil {
			missing = append(missing, p[0], p[1])
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: no in-sync member among slots %v", ErrTooFewMembers, missing)
	}
	// From here on a member that hangs is failed at the deadline, as at
	// run time: the monitor runs before the bitmap is read.
	a.startMonitor()
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
	if !ref.clean {
		dirty := a.bm.dirtyRegions()
		for _, r := range dirty {
			a.resyncNeed()[r>>6].Or(1 << (r & 63))
		}
		if len(dirty) > 0 {
			a.resyncActive.Store(true)
			klog.InfoS("raid10: unclean shutdown, resyncing dirty regions", "regions", len(dirty))
		}
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

// ReplaceMember puts m into slot (which must be faulty or missing) and
// starts its recovery. If m carries this array's superblock for the same
// slot, recent enough that the write-intent bitmap covers everything it
// missed, only the dirty regions are copied (a re-add); otherwise all.
func (a *Array) ReplaceMember(slot int, m Member) error {
	if a.closed.Load() {
		return ErrClosed
	}
	if slot < 0 || slot >= len(a.slots) || m == nil {
		return invalidf("slot %d of %d", slot, len(a.slots))
	}
	// The bitmap's writer token, taken before metaMu (the order of every
	// bitmap write that fails a member): no bitmap block is written
	// between the image given to the new member and its start as a live
	// member (see giveBitmap).
	release := a.bm.hold()
	defer release()
	a.metaMu.Lock()
	// Under metaMu: Grow changes the data size.
	if need := a.geo.dataOffset + a.geo.dataSize; m.Size() < need {
		a.metaMu.Unlock()
		return fmt.Errorf("%w: %d bytes, the array needs %d", ErrMemberTooSmall, m.Size(), need)
	}
	s := a.slots[slot]
	if st := MemberState(s.state.Load()); st == MemberInSync || st == MemberRecovering {
		a.metaMu.Unlock()
		return fmt.Errorf("%w: slot %d is %s", ErrSlotInUse, slot, st)
	}
	// Nothing is read from a member a call is still stuck in (deadline.go).
	if n := a.zombieCount(m); n > 0 {
		a.metaMu.Unlock()
		return fmt.Errorf("%w: slot %d: the member still has %d requests outstanding from before it failed", ErrBusy, slot, n)
	}
	full, uuid, seq := true, newUUID(), uint64(0)
	var bad []badRange
	if sb, err := readSuperblock(m); err == nil && sb.arrayUUID == a.uuid && int(sb.role) == slot &&
		sb.recoveryOff == recoveryDone && sb.events >= a.eventsCleared {
		full, uuid, seq, bad = false, sb.memberUUID, sb.seq, sb.bad
	} else if err != nil && !errors.Is(err, ErrNoSuperblock) {
		klog.V(1).InfoS("raid10: replacement has an unusable superblock, full recovery", "member", slot, "err", err)
	}
	s.fullSync = full
	s.redoDirty, s.recovered = false, 0
	s.broken.Store(false)
	s.sbSeq = seq
	ref := newRef(m, uuid)
	ref.bad.Store(newBadList(bad))
	s.ref.Store(ref)
	s.state.Store(int32(MemberRecovering))
	if err := a.bm.giveBitmap(ref); err != nil {
		a.memberFailedLocked(s, ref, "bitmap write", err)
		a.metaMu.Unlock()
		return fmt.Errorf("%w: slot %d: writing the bitmap to the new member: %w", ErrIO, slot, err)
	}
	a.writeSuperblocksLocked(true, false)
	a.metaMu.Unlock()
	klog.InfoS("raid10: recovery started", "member", slot, "full", full)
	a.kickSync()
	return nil
}

// AddMember puts m into a faulty or missing slot (its own slot if m was a
// member of this array before) and starts recovery. It returns the slot.
func (a *Array) AddMember(m Member) (int, error) {
	if m == nil {
		return -1, invalidf("nil member")
	}
	if n := a.zombieCount(m); n > 0 {
		return -1, fmt.Errorf("%w: the member still has %d requests outstanding from before it failed", ErrBusy, n)
	}
	want := -1
	a.metaMu.Lock() // no superblock write of this array races the read
	sb, err := readSuperblock(m)
	a.metaMu.Unlock()
	if err == nil && sb.arrayUUID == a.uuid && int(sb.role) < len(a.slots) {
		want = int(sb.role)
	}
	free := func(i int) bool {
		st := MemberState(a.slots[i].state.Load())
		return st == MemberFaulty || st == MemberMissing
	}
	if want < 0 || !free(want) {
		want = -1
		for i := range a.slots {
			if free(i) {
				want = i
				break
			}
		}
	}
	if want < 0 {
		return -1, ErrNoFreeSlot
	}
	return want, a.ReplaceMember(want, m)
}
