package raid10

import "time"

// DefaultChunkSize is the chunk size Create uses when none is given (as md).
const DefaultChunkSize = 512 << 10

// DefaultRegionSize is the write-intent bitmap region size Create uses
// when none is given: one bit covers 64 MiB of the array.
const DefaultRegionSize = 64 << 20

// Default resync/recovery rate limits, in bytes per second, like md's
// sync_speed_min (1000 KiB/s) and sync_speed_max (200000 KiB/s).
const (
	DefaultSyncRateMin = 1000 << 10
	DefaultSyncRateMax = 200000 << 10
)

// Options are the run-time settings shared by Create and Assemble. They are
// not persisted.
type Options struct {
	// SyncRateMin is the rate (bytes/s) a resync, recovery or scrub keeps
	// even under foreground I/O. 0 means DefaultSyncRateMin.
	SyncRateMin int64
	// SyncRateMax is the ceiling (bytes/s). 0 means DefaultSyncRateMax; a
	// negative value means unlimited.
	SyncRateMax int64
	// BitmapClearDelay is how long a region must stay idle before its bit
	// is cleared on disk. 0 means 5s.
	BitmapClearDelay time.Duration
	// MemberTimeout is the deadline of one member request: a member with
	// a request outstanding longer is failed (as md fails a member whose
	// device timed out) and the request completes from the other copy.
	// 0 means DefaultMemberTimeout; a negative value disables it. Keep it
	// well below the kernel's NBD request timeout.
	MemberTimeout time.Duration
}

// DefaultMemberTimeout is the member request deadline when
// Options.MemberTimeout is 0.
const DefaultMemberTimeout = 5 * time.Second

// CreateOptions configure a new array. The zero value is valid.
type CreateOptions struct {
	Options
	// UUID of the array; zero means random.
	UUID [16]byte
	// ChunkSize in bytes, a power of two >= BlockSize. 0 means
	// DefaultChunkSize.
	ChunkSize int64
	// RegionSize of the write-intent bitmap, a multiple of ChunkSize. 0
	// means DefaultRegionSize (at least one chunk).
	RegionSize int64
	// Size caps the usable size (a multiple of BlockSize); 0 uses all the
	// space of the smallest member.
	Size int64
	// AssumeClean skips the initial resync: the caller promises the members
	// read back identically (fresh sparse files, zeroed extents). Without
	// it every region is marked dirty and resynced in the background.
	AssumeClean bool
}

// AssembleOptions configure Assemble.
type AssembleOptions struct {
	Options
	// UUID, when non-zero, is the array expected; members of other arrays
	// are then an error like any mixture.
	UUID [16]byte
	// Witnesses are former members that must not serve (their disk was
	// failed or is being replaced) but whose superblocks still tell what
	// the array went through: each is read (within the member deadline) and,
	// when its event count is the highest, its view decides which members
	// are in sync. A member that missed writes the witness took while that
	// member was away is then recovered, or the assembly fails when it holds
	// the only copy, instead of being trusted with stale data. A witness
	// that cannot be read in time, or is of another array, is ignored: it
	// can only make the assembly more careful, never let it trust more.
	Witnesses []Member
	// Doubtful, parallel to the members, marks those that may have missed
	// writes without any superblock here knowing: the caller ran the array
	// without them while some other member, absent now, was there (a disk
	// away at a start). A doubtful member's own superblock is then no proof
	// that it is in sync: unless a member that is not doubtful, or a
	// witness, saw at least its events, it counts as in sync only where its
	// mirror partners are all present (the freshest of them decides, as
	// always); where a partner is absent it is rebuilt in full, or the
	// assembly fails when no other copy is in sync.
	Doubtful []bool
}

// ArrayState is the health of the whole array.
type ArrayState int

const (
	// ArrayOptimal means every slot is in sync and no block is recorded bad.
	ArrayOptimal ArrayState = iota
	// ArrayDegraded means some slot is not in sync, or some blocks are
	// recorded bad (Status.BadBlocks), but every chunk has an in-sync copy;
	// only blocks counted in Status.LostBlocks fail to read.
	ArrayDegraded
	// ArrayFailed means some chunk has no in-sync copy; I/O there fails.
	ArrayFailed
	// ArrayClosed means Close was called.
	ArrayClosed
)

func (s ArrayState) String() string {
	switch s {
	case ArrayOptimal:
		return "optimal"
	case ArrayDegraded:
		return "degraded"
	case ArrayFailed:
		return "failed"
	case ArrayClosed:
		return "closed"
	}
	return "unknown"
}

// MemberState is the state of one slot.
type MemberState int32

const (
	// MemberInSync means the member holds current data and serves reads.
	MemberInSync MemberState = iota
	// MemberRecovering means the member receives every write and is being
	// rebuilt; it serves no reads until recovery ends.
	MemberRecovering
	// MemberFaulty means the member failed (I/O error, FailMember); it gets no
	// I/O until replaced or re-added.
	MemberFaulty
	// MemberMissing means no member in this slot.
	MemberMissing
)

func (s MemberState) String() string {
	switch s {
	case MemberInSync:
		return "in-sync"
	case MemberRecovering:
		return "recovering"
	case MemberFaulty:
		return "faulty"
	case MemberMissing:
		return "missing"
	}
	return "unknown"
}

// SyncKind names the background operation in SyncProgress.
type SyncKind int

// The background operations.
const (
	SyncNone     SyncKind = iota // no resync, recovery or scrub running
	SyncResync                   // make the copies of dirty regions equal after an unclean shutdown
	SyncRecovery                 // rebuild a recovering member
	SyncCheck                    // scrub: compare copies, count mismatches
	SyncRepair                   // scrub: compare copies, rewrite mismatches
)

func (k SyncKind) String() string {
	return [...]string{"idle", "resync", "recovery", "check", "repair"}[k]
}

// SyncProgress reports a running (or the last) resync, recovery or scrub.
type SyncProgress struct {
	Kind    SyncKind
	Running bool
	// Done and Total are array bytes to visit (only dirty regions for a
	// bitmap-based resync or recovery).
	Done, Total int64
	// Rate is bytes/s over the last few seconds.
	Rate float64
	// ETA is the time left at Rate (0 when unknown).
	ETA time.Duration
	// Mismatches found by a scrub, in blocks (BlockSize).
	Mismatches int64
}

// MemberStatus is one slot of the Status snapshot.
type MemberStatus struct {
	Slot        int
	State       MemberState
	UUID        [16]byte
	ReadErrors  uint64
	WriteErrors uint64
	ReadOps     uint64
	WriteOps    uint64
	ReadBytes   uint64
	WriteBytes  uint64
	InFlight    int64
	// BadBlocks is the number of BlockSize blocks recorded bad on this
	// member: its copy of them holds no valid data (see the bad-block
	// list in the package documentation).
	BadBlocks int64
	// TimedOut counts member requests that passed Options.MemberTimeout.
	TimedOut uint64
	// SlowLastCopy counts the stalls past Options.MemberTimeout of this
	// member that were waited for, not failed: it held the last in-sync copy
	// of some chunk (failing it would lose the chunk), or the other copy was
	// late too (a stall both copies share; failing one would serve nothing
	// sooner and only leave the array degraded).
	SlowLastCopy uint64
}

// Status is a snapshot of the array for the node agent, metrics and kubectl.
type Status struct {
	UUID       [16]byte
	State      ArrayState
	Size       int64
	ChunkSize  int64
	RegionSize int64
	RaidDisks  int
	Events     uint64
	// DirtyRegions is the number of write-intent bitmap bits set.
	DirtyRegions int64
	// BadBlocks is the number of blocks recorded bad, summed over the
	// members. A block bad on one copy is still served by the other;
	// LostBlocks counts those bad on every copy (reads there fail with
	// EIO). Either being non-zero makes an otherwise optimal array
	// Degraded.
	BadBlocks  int64
	LostBlocks int64
	Members    []MemberStatus
	Sync       SyncProgress
	ReadOps    uint64
	WriteOps   uint64
	ReadBytes  uint64
	WriteBytes uint64
	// Limits are the QoS limits in force (SetLimits), with the bursts they
	// use; Throttle counts the requests they delayed.
	Limits   Limits
	Throttle ThrottleStatus
}

// ScrubResult is what Check and Repair found.
type ScrubResult struct {
	// Checked is the number of array bytes compared.
	Checked int64
	// Mismatches is the number of BlockSize blocks whose copies differed.
	Mismatches int64
	// Repaired is the number of blocks rewritten (Repair only).
	Repaired int64
	// Lost is the number of blocks found with no readable copy (recorded
	// bad; reads of them fail with EIO).
	Lost int64
}
