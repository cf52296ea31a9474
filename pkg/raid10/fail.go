package raid10

import (
	"fmt"

	"k8s.io/klog/v2"
)

// Member failure: a member that errors is failed durably in the other
// superblocks, or, holding the last in-sync copy of some chunk, marked broken
// (or its range recorded bad) instead.

// memberFailed fails the slot (unless its member was replaced meanwhile).
// The failure is in the superblocks of the remaining members before any
// write skips the member: until then the slot is only "failing", writes
// still go to it, and one that errors waits here on metaMu. So a write
// acknowledged on one copy can never be read back from the stale one after
// a crash. As md does, the last in-sync copy of some chunk is never failed:
// it is marked broken instead (the array reports Failed, I/O that needs it
// fails) and its superblock stays as it was, so the array can be assembled
// again once the member is back.
func (a *Array) memberFailed(s *slot, r *memberRef, op string, err error) {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	a.memberFailedLocked(s, r, op, err)
}

// memberFailedLocked is memberFailed with metaMu held.
func (a *Array) memberFailedLocked(s *slot, r *memberRef, op string, err error) {
	if s.ref.Load() != r {
		return
	}
	st := MemberState(s.state.Load())
	if st == MemberFaulty || st == MemberMissing {
		return
	}
	if !a.canFailLocked(s) {
		if !s.broken.Swap(true) {
			klog.ErrorS(err, "raid10: last copy failed, array failed", "array", a.logID(), "member", s.idx, "op", op)
		}
		return
	}
	klog.ErrorS(err, "raid10: member failed", "array", a.logID(), "member", s.idx, "op", op)
	s.failing.Store(true)
	a.writeSuperblocksLocked(true, false)
}

// failed handles a write error of member s on member bytes [off,
// off+length) and reports whether that copy can no longer be read as
// current: the member is durably failed (or was replaced meanwhile), or,
// where it holds the last in-sync copy of some other chunk and cannot be
// failed, the range is durably recorded in its bad-block list (as md's
// narrow_write_error does). Otherwise the member is broken and false.
func (a *Array) failed(s *slot, r *memberRef, err error, off, length int64) bool {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	if s.ref.Load() != r {
		return true
	}
	if st := MemberState(s.state.Load()); st == MemberFaulty || st == MemberMissing {
		return true
	}
	if !a.canFailLocked(s) && length > 0 {
		if a.recordBadLocked(s, r, off, length) {
			klog.ErrorS(err, "raid10: write error on a member holding a last copy: range recorded bad", "array", a.logID(), "member", s.idx, "offset", off, "length", length)
			return true
		}
	}
	a.memberFailedLocked(s, r, "write", err)
	return s.ref.Load() != r || MemberState(s.state.Load()) != MemberInSync
}

// canFailLocked reports whether s may be failed: it must not hold the last
// in-sync copy of any chunk. Caller holds metaMu.
func (a *Array) canFailLocked(s *slot) bool {
	if MemberState(s.state.Load()) != MemberInSync {
		return true
	}
	for _, other := range a.geo.partners(s.idx) {
		if MemberState(a.slots[other].state.Load()) != MemberInSync || a.slots[other].failing.Load() {
			return false
		}
	}
	return true
}

// FailMember marks slot faulty, as mdadm --fail does.
func (a *Array) FailMember(slot int) error {
	if slot < 0 || slot >= len(a.slots) {
		return invalidf("slot %d of %d", slot, len(a.slots))
	}
	s := a.slots[slot]
	r := s.ref.Load()
	if r == nil {
		return nil
	}
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	if st := MemberState(s.state.Load()); st == MemberFaulty || st == MemberMissing {
		return nil
	}
	if !a.canFailLocked(s) {
		return fmt.Errorf("%w: slot %d", ErrLastCopy, slot)
	}
	klog.InfoS("raid10: member failed by request", "array", a.logID(), "member", slot)
	s.failing.Store(true)
	a.writeSuperblocksLocked(true, false)
	if MemberState(s.state.Load()) != MemberFaulty {
		return fmt.Errorf("%w: slot %d: no member could record the failure", ErrIO, slot)
	}
	return nil
}
