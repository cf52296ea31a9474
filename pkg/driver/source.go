package driver

import (
	"context"

	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// parseContentSource turns a CreateVolume's volume_content_source into the Raid10Volume's
// spec.source: nil for a blank volume.
func parseContentSource(cs *csi.VolumeContentSource) (*v1alpha1.VolumeSource, error) {
	switch {
	case cs == nil:
		return nil, nil
	case cs.GetSnapshot() != nil:
		id := cs.GetSnapshot().GetSnapshotId()
		if id == "" {
			return nil, fmt.Errorf("volume_content_source.snapshot.snapshot_id: must not be empty: %w", ErrInvalidArgument)
		}
		return &v1alpha1.VolumeSource{Snapshot: id}, nil
	case cs.GetVolume() != nil:
		id := cs.GetVolume().GetVolumeId()
		if id == "" {
			return nil, fmt.Errorf("volume_content_source.volume.volume_id: must not be empty: %w", ErrInvalidArgument)
		}
		return &v1alpha1.VolumeSource{Volume: id}, nil
	}
	return nil, fmt.Errorf("volume_content_source: neither a snapshot nor a volume: %w", ErrInvalidArgument)
}

func sameSource(a, b *v1alpha1.VolumeSource) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func describeSource(s *v1alpha1.VolumeSource) string {
	switch {
	case s == nil:
		return "none: a blank volume"
	case s.Snapshot != "":
		return "snapshot " + s.Snapshot
	}
	return "volume " + s.Volume
}

// sourcePlacement checks a restore's or clone's source and returns the node of the new
// volume, which is the source's (its data is in that node's pool), and its size: the size
// asked, raised to the source's when no limit forbids it.
//
//   - A source that does not exist: NotFound. A snapshot not cut or not copied yet, a
//     source volume not provisioned: Aborted... retried by the provisioner (ErrNotReady is
//     DeadlineExceeded). A source being deleted: FailedPrecondition.
//   - A required size below the source's data: OutOfRange (the restore could not hold it).
//   - Accessibility requirements whose requisite segments exclude the source's node:
//     ResourceExhausted (the CSI spec's code for a topology the plugin cannot provision in;
//     with WaitForFirstConsumer the provisioner then reschedules the pod).
func (c *ControllerServer) sourcePlacement(ctx context.Context, src *v1alpha1.VolumeSource, r *csi.CapacityRange, size int64,
	tr *csi.TopologyRequirement) (string, int64, error) {
	var node, what string
	var srcSize int64
	if src.Snapshot != "" {
		what = "snapshot " + src.Snapshot
		snap, err := c.store.GetSnapshot(ctx, src.Snapshot)
		if err != nil {
			return "", 0, fmt.Errorf("volume_content_source: %w", err)
		}
		switch {
		case snap.DeletionTimestamp != nil:
			return "", 0, fmt.Errorf("volume_content_source: %s is being deleted: %w", what, ErrFailedPrecondition)
		case snap.Status.Phase == v1alpha1.SnapshotPhaseFailed:
			return "", 0, fmt.Errorf("volume_content_source: %s failed: %s: %w", what, snap.Status.Message, ErrFailedPrecondition)
		case !snap.Status.ReadyToUse:
			return "", 0, fmt.Errorf("volume_content_source: %s is not ready to use yet (%d%% copied): %w", what, snap.Status.Percent, ErrNotReady)
		}
		node, srcSize = snap.Spec.Node, snap.Status.SizeBytes
	} else {
		what = "volume " + src.Volume
		vol, err := c.store.GetVolume(ctx, src.Volume)
		if err != nil {
			return "", 0, fmt.Errorf("volume_content_source: %w", err)
		}
		switch {
		case vol.DeletionTimestamp != nil:
			return "", 0, fmt.Errorf("volume_content_source: %s is being deleted: %w", what, ErrFailedPrecondition)
		case vol.Status.Phase == v1alpha1.VolumePhaseFailed:
			return "", 0, fmt.Errorf("volume_content_source: %s failed: %s: %w", what, vol.Status.Message, ErrFailedPrecondition)
		case vol.Status.Capacity == nil:
			return "", 0, fmt.Errorf("volume_content_source: %s is not provisioned yet: %w", what, ErrNotReady)
		}
		node, srcSize = vol.Spec.Node, vol.Status.Capacity.Value()
	}
	if req := r.GetRequiredBytes(); req > 0 && req < srcSize {
		return "", 0, fmt.Errorf("capacity_range: required_bytes %d is smaller than %s, which holds %d bytes: a restore or clone needs at least that: %w",
			req, what, srcSize, ErrOutOfRange)
	}
	if lim := r.GetLimitBytes(); lim > 0 && lim < srcSize {
		return "", 0, fmt.Errorf("capacity_range: limit_bytes %d is smaller than %s, which holds %d bytes: %w", lim, what, srcSize, ErrOutOfRange)
	}
	size = max(size, srcSize)
	if req := tr.GetRequisite(); len(req) > 0 {
		var allowed []string
		for _, t := range req {
			n := t.GetSegments()[v1alpha1.TopologyNodeKey]
			if n == node {
				return node, size, nil
			}
			allowed = append(allowed, n)
		}
		return "", 0, fmt.Errorf("accessibility_requirements: %s is on node %q and a restore or clone stays on its source's node, but the requisite topology allows only %v: %w",
			what, node, allowed, ErrTopology)
	}
	return node, size, nil
}

// sourceBusy is an error wrapping ErrFailedPrecondition while volume id cannot go yet: a
// clone of it is still copying from it, or a snapshot of it is not fully copied (the copy
// reads the volume's data as of the cut).
func (c *ControllerServer) sourceBusy(ctx context.Context, id string) error {
	if err := c.copiesFrom(ctx, v1alpha1.VolumeSource{Volume: id}); err != nil {
		return err
	}
	snaps, err := c.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var busy []string
	for i := range snaps {
		s := &snaps[i]
		if s.Spec.Source == id && s.DeletionTimestamp == nil && !s.Status.ReadyToUse && s.Status.Phase != v1alpha1.SnapshotPhaseFailed {
			busy = append(busy, fmt.Sprintf("%s (%d%% copied)", s.Name, s.Status.Percent))
		}
	}
	if len(busy) > 0 {
		return fmt.Errorf("volume %q has snapshots still copying from it: %v: delete it once they are ready (or delete them first): %w",
			id, busy, ErrFailedPrecondition)
	}
	return nil
}
