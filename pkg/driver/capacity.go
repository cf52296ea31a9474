package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// layoutBytes is the usable size (after mirroring) that a near-2 array of members members can
// get when each member takes at most the value that per gives for one disk: the members take
// the members largest healthy disks, and every member gets as much as the smallest of them.
// Zero when the node has fewer healthy disks than members.
func layoutBytes(n *v1alpha1.Raid10Node, members int32, per func(v1alpha1.DiskStatus) int64) int64 {
	var sizes []int64
	for _, d := range n.Status.Disks {
		if d.State == v1alpha1.DiskStateHealthy {
			sizes = append(sizes, per(d))
		}
	}
	if members <= 0 || int(members) > len(sizes) {
		return 0
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i] > sizes[j] })
	perMember := sizes[members-1]
	return perMember * int64(members) / 2
}

// nodeUsable is the largest volume of that layout the node could ever hold.
func nodeUsable(n *v1alpha1.Raid10Node, members int32) int64 {
	return layoutBytes(n, members, func(d v1alpha1.DiskStatus) int64 { return d.SizeBytes })
}

// nodeFree is the largest volume of that layout the node can hold now: what the agent reports
// free on the disks, less the volumes on that node that the agent has not allocated yet (phase
// empty or Pending), except the volume named except, and less the snapshots it has not cut
// yet (each takes its source's size).
func nodeFree(ctx context.Context, store VolumeStore, n *v1alpha1.Raid10Node, members int32, except string) (int64, error) {
	free := layoutBytes(n, members, func(d v1alpha1.DiskStatus) int64 { return d.FreeBytes })
	vols, snaps, err := nodeObjects(ctx, store, n.Name)
	if err != nil {
		return 0, err
	}
	for i := range vols {
		v := &vols[i]
		if v.Spec.Node != n.Name || v.Name == except || v.DeletionTimestamp != nil {
			continue
		}
		if v.Status.Phase == "" || v.Status.Phase == v1alpha1.VolumePhasePending {
			free -= v.Spec.SizeBytes
		}
	}
	// Snapshots not cut yet take their source's size as soon as the agent gets to them.
	for i := range snaps {
		s := &snaps[i]
		if s.Spec.Node != n.Name || s.DeletionTimestamp != nil || s.Status.CutAt != nil || s.Status.Phase == v1alpha1.SnapshotPhaseFailed {
			continue
		}
		for j := range vols {
			if vols[j].Name == s.Spec.Source && vols[j].Status.Capacity != nil {
				free -= vols[j].Status.Capacity.Value()
			}
		}
	}
	return max(free, 0), nil
}

// CapacityReads is GetCapacity's own view of the objects (WithCapacityReads).
type CapacityReads interface {
	// Store reads the Raid10Nodes, Raid10Volumes and Raid10Snapshots, and reports false
	// while it cannot answer yet (an informer cache not synced): GetCapacity then reads
	// the VolumeStore.
	Store() (VolumeStore, bool)
}

// capacityStore is what GetCapacity reads: the capacity reader once it answers, else the
// VolumeStore.
func (c *ControllerServer) capacityStore() VolumeStore {
	if c.capacity != nil {
		if s, ok := c.capacity.Store(); ok {
			return s
		}
	}
	return c.store
}

// NodeScopedStore is a VolumeStore that can list the volumes and snapshots of one node
// (spec.node) without the rest of the cluster's. KubeStore does, with a field selector
// that the API server applies, so that a node's capacity (GetCapacity, which the
// provisioner asks for every node each capacity poll, and CreateVolume's check) costs what
// that node holds, not every volume of the cluster (issue 28: O(nodes x volumes) per poll).
type NodeScopedStore interface {
	// ListNodeVolumes lists the Raid10Volumes whose spec.node is node.
	ListNodeVolumes(ctx context.Context, node string) ([]v1alpha1.Raid10Volume, error)
	// ListNodeSnapshots lists the Raid10Snapshots whose spec.node is node.
	ListNodeSnapshots(ctx context.Context, node string) ([]v1alpha1.Raid10Snapshot, error)
}

// nodeObjects lists the volumes and snapshots of node: through the store's NodeScopedStore
// when it has one, else every one (a store of one node, such as LocalStore, has no others).
func nodeObjects(ctx context.Context, store VolumeStore, node string) ([]v1alpha1.Raid10Volume, []v1alpha1.Raid10Snapshot, error) {
	if ns, ok := store.(NodeScopedStore); ok {
		vols, err := ns.ListNodeVolumes(ctx, node)
		if err != nil {
			return nil, nil, err
		}
		snaps, err := ns.ListNodeSnapshots(ctx, node)
		return vols, snaps, err
	}
	vols, err := store.ListVolumes(ctx)
	if err != nil {
		return nil, nil, err
	}
	snaps, err := store.ListSnapshots(ctx)
	return vols, snaps, err
}

// checkCapacity reports whether node can give grow more bytes to a volume of that layout and
// total size: an error wrapping ErrInsufficientCapacity when it cannot, now or ever, or when
// the node has no Raid10Node (no agent runs there). Both are ResourceExhausted, not
// OutOfRange, on purpose: with WaitForFirstConsumer the provisioner answers
// ResourceExhausted by rescheduling the pod, and another node may have room.
func (c *ControllerServer) checkCapacity(ctx context.Context, node string, layout v1alpha1.Layout, total, grow int64, except string) error {
	n, err := c.store.GetNode(ctx, node)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("node %q has no raid10 agent (no Raid10Node): %w", node, ErrInsufficientCapacity)
	}
	if err != nil {
		return err
	}
	if usable := nodeUsable(n, layout.Members); total > usable {
		return fmt.Errorf("node %q: %d bytes asked, but %d healthy disks give at most %d usable bytes to a %d-member volume: %w",
			node, total, n.Status.HealthyDisks, usable, layout.Members, ErrInsufficientCapacity)
	}
	free, err := nodeFree(ctx, c.store, n, layout.Members, except)
	if err != nil {
		return err
	}
	if grow > free {
		return fmt.Errorf("node %q: %d bytes asked, %d usable bytes free for a %d-member volume: %w",
			node, grow, free, layout.Members, ErrInsufficientCapacity)
	}
	return nil
}
