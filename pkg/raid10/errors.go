package raid10

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors. I/O failures wrap syscall.EIO and argument errors wrap
// syscall.EINVAL as well, so callers (the NBD server) can map them with
// errors.Is without knowing this package.
var (
	// ErrInvalid is returned for an out-of-range or misaligned request or a
	// bad option. It wraps syscall.EINVAL.
	ErrInvalid = &wrapped{msg: "raid10: invalid argument", errno: syscall.EINVAL}
	// ErrIO is returned when no copy of the data could be read or written.
	// It wraps syscall.EIO.
	ErrIO = &wrapped{msg: "raid10: I/O error", errno: syscall.EIO}
	// ErrClosed is returned by every method after Close. It wraps syscall.EIO.
	ErrClosed = &wrapped{msg: "raid10: array closed", errno: syscall.EIO}
	// ErrMemberGone is returned by a member that has disappeared (a
	// FaultyMember after Disappear, a device that was unplugged). It wraps
	// syscall.EIO.
	ErrMemberGone = &wrapped{msg: "raid10: member gone", errno: syscall.EIO}

	// ErrNoSuperblock: the member carries no raid10 superblock (neither copy
	// has the magic).
	ErrNoSuperblock = errors.New("raid10: no superblock")
	// ErrCorruptSuperblock: a superblock copy has the magic but a bad
	// checksum, an unknown version or inconsistent fields.
	ErrCorruptSuperblock = errors.New("raid10: corrupt superblock")
	// ErrCorruptBitmap: a bitmap block has a bad magic or checksum.
	ErrCorruptBitmap = errors.New("raid10: corrupt bitmap block")
	// ErrMixedArrays: Assemble was given members of different arrays.
	ErrMixedArrays = errors.New("raid10: members belong to different arrays")
	// ErrGeometryMismatch: members of one array disagree on its geometry.
	ErrGeometryMismatch = errors.New("raid10: members disagree on geometry")
	// ErrDuplicateRole: two members claim the same slot with the same event
	// counter.
	ErrDuplicateRole = errors.New("raid10: two members claim the same slot")
	// ErrTooFewMembers: some chunk has no in-sync copy among the members
	// given (or fewer than two members were given to Create).
	ErrTooFewMembers = errors.New("raid10: too few members for the data")
	// ErrWitnessNeeded: an assembly failed with ErrTooFewMembers because a
	// witness (AssembleOptions.Witnesses) saw writes the members missed: the
	// current copy of some data is on a witness, which must come back as a
	// member for the array to start.
	ErrWitnessNeeded = errors.New("raid10: the current copy is on a witness")
	// ErrMemberTooSmall: a member cannot hold the metadata and one chunk.
	ErrMemberTooSmall = errors.New("raid10: member too small")
	// ErrBusy: another resync, recovery or scrub is running.
	ErrBusy = errors.New("raid10: sync operation in progress")
	// ErrSlotInUse: ReplaceMember on a slot whose member is still in sync or
	// recovering; fail it first.
	ErrSlotInUse = errors.New("raid10: slot in use")
	// ErrLastCopy: FailMember on a member holding the last in-sync copy of
	// some chunk.
	ErrLastCopy = errors.New("raid10: member holds the last in-sync copy of some data")
	// ErrNoFreeSlot: AddMember found no faulty or missing slot.
	ErrNoFreeSlot = errors.New("raid10: no free slot")
)

// Internal reasons, never returned to callers as such.
var (
	errBadListFull   = errors.New("raid10: bad-block list full")
	errDeviceFailing = errors.New("raid10: read errors and the superblock unreadable: device failing")
)

// wrapped is a sentinel that also matches a syscall.Errno under errors.Is.
type wrapped struct {
	msg   string
	errno syscall.Errno
}

func (e *wrapped) Error() string { return e.msg }

// Is makes errors.Is(err, syscall.EIO) (or EINVAL) true for the sentinel.
func (e *wrapped) Is(target error) bool {
	t, ok := target.(syscall.Errno)
	return ok && t == e.errno
}

// MemberError names the member an error came from: the slot for I/O
// errors, the position in the members slice for Assemble's superblock
// errors (so a caller can retry with that entry nil to start degraded).
// errors.Is sees through it to the sentinel or errno inside.
type MemberError struct {
	Member int
	Op     string
	Err    error
}

func (e *MemberError) Error() string {
	return fmt.Sprintf("raid10: member %d: %s: %v", e.Member, e.Op, e.Err)
}

func (e *MemberError) Unwrap() error { return e.Err }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
