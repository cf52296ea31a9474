package raid10

import (
	"errors"
	"fmt"

	"k8s.io/klog/v2"
)

// Member changes on a running array: ReplaceMember and AddMember.

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
