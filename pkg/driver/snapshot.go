package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// The CreateSnapshot parameters csi-snapshotter adds with --extra-create-metadata.
const (
	paramSnapshotName        = "csi.storage.k8s.io/volumesnapshot/name"
	paramSnapshotNamespace   = "csi.storage.k8s.io/volumesnapshot/namespace"
	paramSnapshotContentName = "csi.storage.k8s.io/volumesnapshotcontent/name"
)

// snapshotID is the Raid10Snapshot name (and CSI snapshot ID) for a CreateSnapshot name: the
// name itself when it is a valid Kubernetes object name and pool name (csi-snapshotter's
// snapshot-<uid> always is), else a stable hash of it. Stable: the same name always gives the
// same ID, which makes CreateSnapshot idempotent by name.
func snapshotID(name string) string {
	if len(validation.IsDNS1123Subdomain(name)) == 0 && pool.ValidateName(name) == nil {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "r10s-" + hex.EncodeToString(sum[:16])
}

// snapshotLockKey keeps snapshot IDs and volume IDs apart in the one VolumeLocks.
func snapshotLockKey(id string) string { return "snapshot/" + id }

// CreateSnapshot creates the Raid10Snapshot for req.Name on the source volume's node and waits
// until that node's agent has made the cut durable; it answers at once with ready_to_use
// false and creation_time the cut. csi-snapshotter calls it again with the same name until
// ready_to_use is true: the retry finds the object and reports the copy's state.
func (c *ControllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	name, source := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, fmt.Errorf("name: must not be empty: %w", ErrInvalidArgument)
	}
	if source == "" {
		return nil, fmt.Errorf("source_volume_id: must not be empty: %w", ErrInvalidArgument)
	}
	limits, err := parseSnapshotParams(req.GetParameters())
	if err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	id := snapshotID(name)
	if err := c.locks.TryAcquire(snapshotLockKey(id)); err != nil {
		return nil, err
	}
	defer c.locks.Release(snapshotLockKey(id))

	snap, err := c.store.GetSnapshot(ctx, id)
	switch {
	case err == nil:
		if got := snap.Annotations[v1alpha1.CSINameAnnotation]; got != name {
			return nil, fmt.Errorf("snapshot %q belongs to CreateSnapshot name %q, not %q: %w", id, got, name, ErrAlreadyExists)
		}
		if snap.Spec.Source != source {
			return nil, fmt.Errorf("snapshot %q exists with source volume %q, not %q: %w", id, snap.Spec.Source, source, ErrAlreadyExists)
		}
		if snap.DeletionTimestamp != nil {
			return nil, fmt.Errorf("snapshot %q: an earlier attempt is still being cleaned up: %w", id, ErrOperationInFlight)
		}
	case errors.Is(err, ErrNotFound):
		vol, err := c.store.GetVolume(ctx, source)
		if err != nil {
			return nil, fmt.Errorf("source_volume_id: %w", err)
		}
		if vol.DeletionTimestamp != nil {
			return nil, fmt.Errorf("source volume %q is being deleted: %w", source, ErrFailedPrecondition)
		}
		if vol.Status.Phase == v1alpha1.VolumePhaseFailed || vol.Status.Capacity == nil {
			return nil, fmt.Errorf("source volume %q is not provisioned (phase %q): %w", source, vol.Status.Phase, ErrFailedPrecondition)
		}
		if err := c.createSnapshot(ctx, id, name, vol, req.GetParameters(), limits); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}

	snap, err = c.waitCut(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(snap)}, nil
}

// createSnapshot creates the Raid10Snapshot id of vol once the node's free space and the
// snapshot limits allow it. The limits are checked and the object created under the node's
// snapshot-limit lock.
func (c *ControllerServer) createSnapshot(ctx context.Context, id, name string, vol *v1alpha1.Raid10Volume, params map[string]string, limits snapshotLimits) error {
	if err := c.locks.TryAcquire(snapshotLimitLockKey(vol.Spec.Node)); err != nil {
		return err
	}
	defer c.locks.Release(snapshotLimitLockKey(vol.Spec.Node))
	size := vol.Status.Capacity.Value()
	if err := c.checkSnapshotLimits(ctx, vol, size, limits); err != nil {
		return fmt.Errorf("snapshot of volume %q: %w", vol.Name, err)
	}
	if err := c.checkCapacity(ctx, vol.Spec.Node, vol.Spec.Layout, size, size, ""); err != nil {
		return fmt.Errorf("snapshot of volume %q: %w", vol.Name, err)
	}
	if err := c.store.CreateSnapshot(ctx, newSnapshot(id, name, vol, params)); err != nil {
		if errors.Is(err, ErrAlreadyExists) {
			return fmt.Errorf("snapshot %q: created concurrently: %w", id, ErrConflict)
		}
		return err
	}
	return nil
}

func newSnapshot(id, name string, vol *v1alpha1.Raid10Volume, params map[string]string) *v1alpha1.Raid10Snapshot {
	snap := &v1alpha1.Raid10Snapshot{Spec: v1alpha1.Raid10SnapshotSpec{Source: vol.Name, Node: vol.Spec.Node}}
	snap.Name = id
	snap.Finalizers = []string{v1alpha1.VolumeFinalizer}
	snap.Annotations = map[string]string{v1alpha1.CSINameAnnotation: name}
	for k, v := range map[string]string{
		v1alpha1.VolumeSnapshotNameAnnotation:        params[paramSnapshotName],
		v1alpha1.VolumeSnapshotNamespaceAnnotation:   params[paramSnapshotNamespace],
		v1alpha1.VolumeSnapshotContentNameAnnotation: params[paramSnapshotContentName],
	} {
		if v != "" {
			snap.Annotations[k] = v
		}
	}
	return snap
}

// waitCut waits until the node agent reports the cut of snapshot id (status.cutAt for the
// current generation). A snapshot the agent reports Failed before any cut holds nothing: it
// is deleted, so that a retry starts afresh, and the error says why (ResourceExhausted for
// no room, NotFound for a source the pool does not have).
func (c *ControllerServer) waitCut(ctx context.Context, id string) (*v1alpha1.Raid10Snapshot, error) {
	var last *v1alpha1.Raid10Snapshot
	err := c.poll(ctx, func() (bool, error) {
		snap, err := c.store.GetSnapshot(ctx, id)
		if err != nil {
			return false, err
		}
		last = snap
		st := snap.Status
		if st.ObservedGeneration < snap.Generation {
			return false, nil
		}
		if st.Phase != v1alpha1.SnapshotPhaseFailed {
			return st.CutAt != nil, nil
		}
		cause := ErrVolumeFailed
		if cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); cond != nil {
			switch cond.Reason {
			case v1alpha1.ReasonInsufficientCapacity:
				cause = ErrInsufficientCapacity
			case v1alpha1.ReasonSourceNotFound:
				cause = ErrNotFound
			}
		}
		if st.CutAt == nil {
			if err := c.store.DeleteSnapshot(ctx, id); err != nil {
				return false, err
			}
		}
		return false, fmt.Errorf("snapshot %q of volume %q on node %q: node agent reports Failed: %s: %w",
			id, snap.Spec.Source, snap.Spec.Node, st.Message, cause)
	})
	if errors.Is(err, ErrNotReady) && last != nil {
		return nil, fmt.Errorf("snapshot %q on node %q (phase %q): cut: %w", id, last.Spec.Node, last.Status.Phase, err)
	}
	return last, err
}

// csiSnapshot is the CSI view of a Raid10Snapshot that is cut.
func csiSnapshot(snap *v1alpha1.Raid10Snapshot) *csi.Snapshot {
	s := &csi.Snapshot{
		SnapshotId:     snap.Name,
		SourceVolumeId: snap.Spec.Source,
		SizeBytes:      snap.Status.SizeBytes,
		ReadyToUse:     snap.Status.ReadyToUse,
	}
	if t := snap.Status.CutAt; t != nil {
		s.CreationTime = timestamppb.New(t.Time)
	}
	return s
}

// DeleteSnapshot deletes the Raid10Snapshot and waits until the node agent has freed its
// extents. A missing snapshot is success. A snapshot that a restore still copies from is
// refused with FailedPrecondition, untouched (the pool would refuse it too: the agent then
// waits, and the object shows why).
func (c *ControllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, fmt.Errorf("snapshot_id: must not be empty: %w", ErrInvalidArgument)
	}
	if err := c.locks.TryAcquire(snapshotLockKey(id)); err != nil {
		return nil, err
	}
	defer c.locks.Release(snapshotLockKey(id))
	snap, err := c.store.GetSnapshot(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return &csi.DeleteSnapshotResponse{}, nil
	case err != nil:
		return nil, err
	}
	if snap.DeletionTimestamp == nil {
		if err := c.copiesFrom(ctx, v1alpha1.VolumeSource{Snapshot: id}); err != nil {
			return nil, err
		}
	}
	if err := c.store.DeleteSnapshot(ctx, id); err != nil {
		return nil, err
	}
	err = c.poll(ctx, func() (bool, error) {
		s, err := c.store.GetSnapshot(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			return true, nil
		case err != nil:
			return false, err
		case s.Status.Phase == v1alpha1.SnapshotPhaseDeleting && s.Status.Message != "":
			// The pool refused to free it for now (a restore started meanwhile copies
			// from it); the agent retries and deletes it once that copy is done.
			return false, fmt.Errorf("snapshot %q: %s: %w", id, s.Status.Message, ErrFailedPrecondition)
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot %q: deleted, extents not freed yet: %w", id, err)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// copiesFrom is an error wrapping ErrFailedPrecondition, naming the volumes, while a volume
// made from src (a restore of a snapshot, a clone of a volume) is still copying from it.
func (c *ControllerServer) copiesFrom(ctx context.Context, src v1alpha1.VolumeSource) error {
	vols, err := c.store.ListVolumes(ctx)
	if err != nil {
		return err
	}
	var busy []string
	for i := range vols {
		v := &vols[i]
		if v.Spec.Source == nil || *v.Spec.Source != src || v.DeletionTimestamp != nil {
			continue
		}
		if h := v.Status.Hydration; h == nil || !h.Hydrated {
			pct := int32(0)
			if h != nil {
				pct = h.Percent
			}
			busy = append(busy, fmt.Sprintf("%s (%d%% copied)", v.Name, pct))
		}
	}
	if len(busy) == 0 {
		return nil
	}
	what := "snapshot " + strconv.Quote(src.Snapshot)
	if src.Volume != "" {
		what = "volume " + strconv.Quote(src.Volume)
	}
	return fmt.Errorf("%s is the source of %v, still copying from it: delete it once they are hydrated (or delete them first): %w",
		what, busy, ErrFailedPrecondition)
}

// ListSnapshots lists the Raid10Snapshots that are cut, optionally only the one of
// snapshot_id or those of source_volume_id, in pages of max_entries.
func (c *ControllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, fmt.Errorf("max_entries %d: must not be negative: %w", req.GetMaxEntries(), ErrInvalidArgument)
	}
	all, err := c.store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	var snaps []*csi.Snapshot
	for i := range all {
		s := &all[i]
		if s.Status.CutAt == nil || s.DeletionTimestamp != nil {
			continue // nothing to restore from: not cut yet, failed before the cut, going
		}
		if id := req.GetSnapshotId(); id != "" && s.Name != id {
			continue
		}
		if src := req.GetSourceVolumeId(); src != "" && s.Spec.Source != src {
			continue
		}
		snaps = append(snaps, csiSnapshot(s))
	}
	start, end, err := page(req.GetStartingToken(), req.GetMaxEntries(), len(snaps))
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{}
	for _, s := range snaps[start:end] {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s})
	}
	if end < len(snaps) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}
