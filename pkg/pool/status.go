package pool

import (
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// Health is a volume's health, as the CSI layer and kubectl show it.
type Health string

// Volume health values.
const (
	// Healthy: every member is in sync.
	Healthy Health = "Healthy"
	// Degraded: a member is missing or failed and nothing rebuilds it yet, or blocks are
	// recorded bad (VolumeInfo.BadBlocks, LostBlocks); every chunk but the lost blocks still
	// has a copy.
	Degraded Health = "Degraded"
	// Rebuilding: a member is being rebuilt (replacement, spare or a returning disk).
	Rebuilding Health = "Rebuilding"
	// Failed: some chunk has no copy, or the volume could not be assembled.
	Failed Health = "Failed"
)

// DiskStatus is a disk's state as shown to operators: the table states plus Missing and
// Refused.
type DiskStatus string

// Disk statuses.
const (
	StatusActive  DiskStatus = "Active"
	StatusSpare   DiskStatus = "Spare"
	StatusFailed  DiskStatus = "Failed"
	StatusRemoved DiskStatus = "Removed"
	StatusMissing DiskStatus = "Missing"
	StatusRefused DiskStatus = "Refused"
)

// DiskInfo describes one disk.
type DiskInfo struct {
	UUID     string     `json:"uuid,omitempty"`
	Path     string     `json:"path,omitempty"`
	Status   DiskStatus `json:"status"`
	Identity string     `json:"identity,omitempty"`
	// Size is the disk's size; DataSize the part extents can use.
	Size     uint64 `json:"size"`
	DataSize uint64 `json:"dataSize"`
	Used     uint64 `json:"used"`
	Free     uint64 `json:"free"`
	Extents  int    `json:"extents"`
	// Reason says why a disk is Refused (or Failed).
	Reason string `json:"reason,omitempty"`
}

// MemberInfo is one member (role) of a volume.
type MemberInfo struct {
	Role     int    `json:"role"`
	DiskUUID string `json:"diskUUID,omitempty"`
	DiskPath string `json:"diskPath,omitempty"`
	// State is the engine's view: in-sync, recovering, faulty, missing.
	State  string `json:"state"`
	Offset uint64 `json:"offset"`
	Length uint64 `json:"length"`
	// BadBlocks is the number of blocks (raid10.BlockSize) recorded bad on this member: its
	// copy of them holds no valid data.
	BadBlocks int64 `json:"badBlocks,omitempty"`
	// TimedOut counts this member's requests that passed the member deadline
	// (Config.MemberTimeout) since the array was assembled.
	TimedOut uint64 `json:"timedOut,omitempty"`
	// SlowLastCopy counts this member's stalls past the member deadline while it held the
	// last in-sync copy of some chunk: waited for, not failed (failing it would lose the
	// chunk). A disk that stalls is a candidate for replacement.
	SlowLastCopy uint64 `json:"slowLastCopy,omitempty"`
}

// Progress is the progress of a rebuild or resync.
type Progress struct {
	Kind    string        `json:"kind"`
	Done    int64         `json:"done"`
	Total   int64         `json:"total"`
	Percent float64       `json:"percent"`
	Rate    float64       `json:"rateBytesPerSecond"`
	ETA     time.Duration `json:"eta"`
}

// VolumeInfo describes one volume.
type VolumeInfo struct {
	Name    string       `json:"name"`
	UUID    string       `json:"uuid"`
	Size    uint64       `json:"size"`
	Health  Health       `json:"health"`
	Members []MemberInfo `json:"members"`
	// ChunkSize is the array's chunk size in bytes (as its superblocks record it); 0 while
	// the volume is not assembled.
	ChunkSize uint64 `json:"chunkSize,omitempty"`
	// InSync counts the members in sync, for "4/4" displays.
	InSync int       `json:"inSync"`
	Sync   *Progress `json:"sync,omitempty"`
	Reason string    `json:"reason,omitempty"`
	// BadBlocks is the number of blocks recorded bad, summed over the members; a block bad
	// on one copy is still served by the other. LostBlocks counts the blocks bad on every
	// copy: reads there fail with EIO until the block is written again. Either being
	// non-zero makes the volume at least Degraded.
	BadBlocks  int64 `json:"badBlocks,omitempty"`
	LostBlocks int64 `json:"lostBlocks,omitempty"`
	// TimedOut counts member requests that passed the member deadline, summed over the
	// members.
	TimedOut uint64 `json:"timedOut,omitempty"`
	// Scrub is the volume's current or last scrub since the pool opened; nil if none.
	Scrub *ScrubInfo `json:"scrub,omitempty"`
	// Source is what the volume was filled from (restore or clone); nil for an empty one.
	Source *Source `json:"source,omitempty"`
	// Hydrated is true for a volume without a source, and once its copy is done.
	Hydrated bool `json:"hydrated"`
	// Copied is the number of bytes its copy has done so far.
	Copied uint64 `json:"copied,omitempty"`
	// Limits are the QoS limits in force on the array (SetVolumeLimits; the bursts as in
	// use); nil when it has none or is not assembled. Throttle counts the requests they
	// delayed since the array was assembled; nil while none was and no limit is set.
	Limits   *raid10.Limits         `json:"limits,omitempty"`
	Throttle *raid10.ThrottleStatus `json:"throttle,omitempty"`
}

// Capacity is the pool's capacity. Usable figures are after mirroring: a RAID10 (md near-2)
// volume over N members with extents of E bytes each holds N*E/2 bytes (less the engine's
// metadata at the head of each extent).
type Capacity struct {
	// Raw is the data area of the Active disks (spares, failed and missing disks excluded).
	Raw uint64 `json:"raw"`
	// Usable is Raw/2.
	Usable uint64 `json:"usable"`
	// FreeRaw is the free part of Raw.
	FreeRaw uint64 `json:"freeRaw"`
	// FreeUsable is FreeRaw/2.
	FreeUsable uint64 `json:"freeUsable"`
	// LargestVolume is the size of the largest volume CreateVolume accepts now.
	LargestVolume uint64 `json:"largestVolume"`
	// Spare is the data area of the hot spares.
	Spare uint64 `json:"spare"`
}

// Status is a snapshot of the whole pool.
type Status struct {
	UUID     string       `json:"uuid"`
	Name     string       `json:"name"`
	Capacity Capacity     `json:"capacity"`
	Disks    []DiskInfo   `json:"disks"`
	Volumes  []VolumeInfo `json:"volumes"`
	// Snapshots lists the pool's snapshots, sorted by name.
	Snapshots []SnapshotInfo `json:"snapshots,omitempty"`
}

func healthOf(st raid10.Status) (Health, *Progress) {
	var prog *Progress
	if st.Sync.Running {
		prog = &Progress{Kind: st.Sync.Kind.String(), Done: st.Sync.Done, Total: st.Sync.Total, Rate: st.Sync.Rate, ETA: st.Sync.ETA}
		if st.Sync.Total > 0 {
			prog.Percent = float64(st.Sync.Done) * 100 / float64(st.Sync.Total)
		}
	}
	if st.State != raid10.ArrayOptimal && st.State != raid10.ArrayDegraded {
		return Failed, prog
	}
	// From the members, not st.State: the snapshot reads them after the state, and a
	// recovery that ends in between would show "degraded" with every member in sync.
	recovering, down := false, false
	for _, m := range st.Members {
		switch m.State {
		case raid10.MemberRecovering:
			recovering = true
		case raid10.MemberFaulty, raid10.MemberMissing:
			down = true
		}
	}
	switch {
	case recovering:
		return Rebuilding, prog
	case down, st.BadBlocks > 0, st.LostBlocks > 0:
		// A bad block has one copy fewer than the layout promises (a lost one none): never
		// Healthy, even with every member in sync.
		return Degraded, prog
	}
	return Healthy, prog
}
