package pool

import (
	"fmt"
	"time"
)

// SnapshotInfo describes one snapshot: a full-size mirrored copy of a volume as of its cut.
type SnapshotInfo struct {
	Name       string    `json:"name"`
	UUID       UUID      `json:"uuid"`
	Source     string    `json:"source"`     // origin volume name at the cut
	SourceUUID UUID      `json:"sourceUUID"` // origin volume UUID
	Size       uint64    `json:"size"`       // bytes, the origin's size at the cut
	CutAt      time.Time `json:"cutAt"`      // the cut (CSI creation_time)
	Ready      bool      `json:"ready"`      // copy complete: an independent thick copy
	Copied     uint64    `json:"copied"`     // bytes copied so far (== Size when Ready)
	Health     Health    `json:"health"`
	Members    int       `json:"members"`
}

// Source names what a new volume is filled from: exactly one of Snapshot (a restore) and
// Volume (a clone, the point in time of the create) is set.
type Source struct {
	Snapshot string `json:"snapshot,omitempty"`
	Volume   string `json:"volume,omitempty"`
}

var errNotBuilt = fmt.Errorf("%w: snapshots are not built yet", ErrFailedPrecondition)

// CreateSnapshot cuts a snapshot of volume source.
func (p *Pool) CreateSnapshot(name, source string) (SnapshotInfo, error) {
	return SnapshotInfo{}, errNotBuilt
}

// DeleteSnapshot deletes a snapshot; a missing one is not an error.
func (p *Pool) DeleteSnapshot(name string) error { return errNotBuilt }

// Snapshot describes one snapshot.
func (p *Pool) Snapshot(name string) (SnapshotInfo, error) {
	return SnapshotInfo{}, fmt.Errorf("%w: snapshot %q", ErrNotFound, name)
}

// Snapshots lists every snapshot, sorted by name.
func (p *Pool) Snapshots() []SnapshotInfo { return nil }
