package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// Snapshot space limits (docs/parameters.md, "Snapshot limits"). Kubernetes quotas count only
// claims, while every snapshot holds a full, mirrored copy of its source: these keep one
// volume, and all snapshots on one node, from filling the node.
const (
	// ParamMaxSnapshots is the most snapshots one volume may have at once: a StorageClass
	// parameter (recorded on the volume as maxSnapshotsAnnotation) and a VolumeSnapshotClass
	// parameter; where both are set the smaller applies. 0 or unset: no limit.
	ParamMaxSnapshots = "maxSnapshots"
	// ParamMaxSnapshotBytesPerNode is a VolumeSnapshotClass parameter, a quantity (500Gi):
	// the most bytes the snapshots on one node may hold together, counting each at its size
	// (its source's size when cut; the pool keeps it mirrored, twice that in raw bytes).
	// 0 or unset: no limit.
	ParamMaxSnapshotBytesPerNode = "maxSnapshotBytesPerNode"

	// maxSnapshotsAnnotation carries a volume's StorageClass maxSnapshots from CreateVolume
	// to CreateSnapshot, which sees only the VolumeSnapshotClass's parameters.
	maxSnapshotsAnnotation = "raid10.csi.io/max-snapshots"
)

// snapshotLimits are the validated snapshot-space limits of a CreateSnapshot; 0: none.
type snapshotLimits struct {
	maxSnapshots        int64 // of the VolumeSnapshotClass
	maxBytesPerNode     int64
	maxBytesPerNodeText string // as the class says it, for the error
}

// parseSnapshotParams validates a CreateSnapshot's VolumeSnapshotClass parameters: the
// limits and the keys csi-snapshotter adds. Anything else is an error wrapping
// ErrInvalidArgument that names it.
func parseSnapshotParams(in map[string]string) (snapshotLimits, error) {
	var l snapshotLimits
	for _, k := range slices.Sorted(maps.Keys(in)) { // the first bad parameter, deterministically
		v := in[k]
		switch k {
		case paramSnapshotName, paramSnapshotNamespace, paramSnapshotContentName:
		case ParamMaxSnapshots:
			n, err := parseMaxSnapshots(v)
			if err != nil {
				return l, fmt.Errorf("parameter %s: %w", k, err)
			}
			l.maxSnapshots = n
		case ParamMaxSnapshotBytesPerNode:
			q, err := resource.ParseQuantity(v)
			n, ok := q.AsInt64()
			if err != nil || !ok || n < 0 {
				return l, fmt.Errorf("parameter %s=%q: must be a byte quantity (500Gi), 0 for no limit: %w", k, v, ErrInvalidArgument)
			}
			l.maxBytesPerNode, l.maxBytesPerNodeText = n, v
		default:
			return l, fmt.Errorf("parameter %q: unknown VolumeSnapshotClass parameter (known: %s, %s; a snapshot takes its source's layout): %w",
				k, ParamMaxSnapshots, ParamMaxSnapshotBytesPerNode, ErrInvalidArgument)
		}
	}
	return l, nil
}

// parseMaxSnapshots parses a maxSnapshots value: a whole number, 0 for no limit.
func parseMaxSnapshots(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q: must be a whole number of snapshots, 0 for no limit: %w", v, ErrInvalidArgument)
	}
	return n, nil
}

// snapshotLimitLockKey serialises the check and creation of new snapshots on one node, so
// that two at once cannot both pass a limit that only one fits.
func snapshotLimitLockKey(node string) string { return "snapshot-limit/" + node }

// checkSnapshotLimits refuses a new snapshot of vol (size bytes) that would pass its
// volume's maxSnapshots (the StorageClass's, on the volume, or the class's in l, the smaller)
// or the class's maxSnapshotBytesPerNode. The error wraps ErrInsufficientCapacity
// (ResourceExhausted) and names the limit, where it is set, the current use and the volume.
// Every Raid10Snapshot that exists counts, being deleted too: its extents are held until
// the agent frees them.
func (c *ControllerServer) checkSnapshotLimits(ctx context.Context, vol *v1alpha1.Raid10Volume, size int64, l snapshotLimits) error {
	perVolume, from := l.maxSnapshots, "VolumeSnapshotClass parameter"
	if v, ok := vol.Annotations[maxSnapshotsAnnotation]; ok {
		n, err := parseMaxSnapshots(v)
		if err != nil {
			return fmt.Errorf("volume %q: annotation %s: %w", vol.Name, maxSnapshotsAnnotation, err)
		}
		if n > 0 && (perVolume == 0 || n < perVolume) {
			perVolume, from = n, "StorageClass parameter"
		}
	}
	if perVolume == 0 && l.maxBytesPerNode == 0 {
		return nil
	}
	snaps, err := c.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var ofVolume, onNode int64
	for i := range snaps {
		s := &snaps[i]
		if s.Spec.Source == vol.Name {
			ofVolume++
		}
		if s.Spec.Node == vol.Spec.Node {
			n, err := c.snapshotBytes(ctx, s)
			if err != nil {
				return err
			}
			onNode += n
		}
	}
	if perVolume > 0 && ofVolume >= perVolume {
		return fmt.Errorf("volume %q holds %d snapshot(s), the most that %s=%d (%s) allows: delete one first: %w",
			vol.Name, ofVolume, ParamMaxSnapshots, perVolume, from, ErrInsufficientCapacity)
	}
	if l.maxBytesPerNode > 0 && onNode+size > l.maxBytesPerNode {
		return fmt.Errorf("node %q: its snapshots hold %s; one more of volume %q (%s) would pass %s=%s (VolumeSnapshotClass parameter): %w",
			vol.Spec.Node, bytesText(onNode), vol.Name, bytesText(size), ParamMaxSnapshotBytesPerNode, l.maxBytesPerNodeText, ErrInsufficientCapacity)
	}
	return nil
}

// snapshotBytes is what snapshot s holds: its size once cut, before that its source's size
// (what the cut will take), 0 when the source is gone.
func (c *ControllerServer) snapshotBytes(ctx context.Context, s *v1alpha1.Raid10Snapshot) (int64, error) {
	if s.Status.SizeBytes > 0 {
		return s.Status.SizeBytes, nil
	}
	src, err := c.store.GetVolume(ctx, s.Spec.Source)
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	case src.Status.Capacity != nil:
		return src.Status.Capacity.Value(), nil
	}
	return src.Spec.SizeBytes, nil
}

// bytesText is n as a binary quantity (3Gi), as StorageClass parameters are written.
func bytesText(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
