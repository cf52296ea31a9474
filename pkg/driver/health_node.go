package driver

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// PoolHealth is the node service's read-only view of its pool for the health calls
// (NodeGetVolumeHealth, NodeGetStorageHealth). *pool.Pool implements it.
type PoolHealth interface {
	// Volume describes a volume of the pool; a volume it does not have is an error wrapping
	// pool.ErrNotFound.
	Volume(name string) (pool.VolumeInfo, error)
	// Disks lists every disk of the pool: claimed, missing, refused, removed.
	Disks() []pool.DiskInfo
	// Status snapshots the whole pool: capacity, disks, volumes.
	Status() pool.Status
}

var _ PoolHealth = (*pool.Pool)(nil)

// Reasons of the NodeGetStorageHealth entries: one entry per reason, naming every disk or
// volume it concerns, each message ending with the pool's summary (disks, spares, capacity).
const (
	// StorageReasonPoolUnusable (STORAGE_UNREACHABLE): fewer than two active disks are
	// present: no volume can be served or created.
	StorageReasonPoolUnusable = "PoolUnusable"
	// StorageReasonDiskFailed (STORAGE_DEGRADED): disks failed (by the engine or an
	// operator) or refused at start (unreadable, foreign).
	StorageReasonDiskFailed = "DiskFailed"
	// StorageReasonDiskMissing (STORAGE_DEGRADED): member disks not found at start or since.
	StorageReasonDiskMissing = "DiskMissing"
	// StorageReasonDiskErrors (STORAGE_DEGRADED): active disks holding blocks recorded bad,
	// or whose requests passed the member deadline: candidates for replacement.
	StorageReasonDiskErrors = "DiskErrors"
	// StorageReasonVolumesNotRedundant (STORAGE_DEGRADED): volumes Degraded, Rebuilding or
	// Failed.
	StorageReasonVolumesNotRedundant = "VolumesNotRedundant"
	// StorageReasonNoFreeCapacity (STORAGE_DEGRADED): no new volume fits.
	StorageReasonNoFreeCapacity = "NoFreeCapacity"
)

// NodeGetVolumeHealth reports a volume's health from the pool: the same entries as
// ControllerGetVolumeHealth gives from the Raid10Volume status, read first-hand (members
// named by disk path). The publish and staging paths are not needed.
func (n *NodeServer) NodeGetVolumeHealth(_ context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if err := requireFields(field{"volume_id", id}); err != nil {
		return nil, err
	}
	if n.pool == nil {
		return nil, fmt.Errorf("NodeGetVolumeHealth: this node service has no pool to read: %w", ErrUnimplemented)
	}
	vi, err := n.pool.Volume(id)
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w", id, err)
	}
	disks := n.pool.Disks()
	ids := crstatus.DiskIDs(disks)
	st := crstatus.VolumeStatus(v1alpha1.Raid10VolumeStatus{}, &v1alpha1.Raid10Volume{}, vi, ids, time.Now())
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: volumeHealth(id, &st, poolDiskNames(disks, ids))}, nil
}

// poolDiskNames names a disk ID (crstatus.DiskIDs) as "path (ID)".
func poolDiskNames(disks []pool.DiskInfo, ids map[string]string) func(string) string {
	n := &v1alpha1.Raid10Node{}
	for _, d := range disks {
		n.Status.Disks = append(n.Status.Disks, v1alpha1.DiskStatus{ID: ids[crstatus.DiskKey(d)], Path: d.Path})
	}
	return nodeDiskNames(n)
}

// NodeGetStorageHealth reports the pool's adverse conditions (an empty list: every disk
// healthy, every volume redundant, room for a new volume): each disk's state and errors,
// missing disks, volumes not redundant, and in every message the spares and the free
// capacity.
func (n *NodeServer) NodeGetStorageHealth(context.Context, *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	if n.pool == nil {
		return nil, fmt.Errorf("NodeGetStorageHealth: this node service has no pool to read: %w", ErrUnimplemented)
	}
	ps := n.pool.Status()
	summary := poolSummary(ps)
	resp := &csi.NodeGetStorageHealthResponse{}
	add := func(s csi.StorageHealthErrorType, reason string, items []string) {
		if len(items) > 0 {
			resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
				Status: s, Reason: reason, Message: capMessage(strings.Join(items, "; ") + ". " + summary)})
		}
	}
	failed, missing, active := diskProblems(ps.Disks)
	if active < 2 {
		add(csi.StorageHealthErrorType_STORAGE_UNREACHABLE, StorageReasonPoolUnusable,
			[]string{fmt.Sprintf("%d active disks present, a volume needs at least 2", active)})
	}
	add(csi.StorageHealthErrorType_STORAGE_DEGRADED, StorageReasonDiskFailed, failed)
	add(csi.StorageHealthErrorType_STORAGE_DEGRADED, StorageReasonDiskMissing, missing)
	add(csi.StorageHealthErrorType_STORAGE_DEGRADED, StorageReasonDiskErrors, diskErrors(ps))
	add(csi.StorageHealthErrorType_STORAGE_DEGRADED, StorageReasonVolumesNotRedundant, volumesNotRedundant(ps.Volumes))
	if ps.Capacity.LargestVolume == 0 && active >= 2 {
		add(csi.StorageHealthErrorType_STORAGE_DEGRADED, StorageReasonNoFreeCapacity, []string{"no new volume fits"})
	}
	return resp, nil
}

// diskProblems describes the failed or refused and the missing disks, and counts the
// active ones present. A Removed disk (replaced) is no longer part of the pool.
func diskProblems(disks []pool.DiskInfo) (failed, missing []string, active int) {
	for _, d := range disks {
		name := diskLabel(d)
		switch d.Status {
		case pool.StatusActive:
			active++
		case pool.StatusFailed, pool.StatusRefused:
			s := fmt.Sprintf("disk %s %s", name, d.Status)
			if d.Reason != "" {
				s += ": " + d.Reason
			}
			failed = append(failed, s)
		case pool.StatusMissing:
			missing = append(missing, fmt.Sprintf("disk %s Missing: not found at start or since", name))
		}
	}
	return failed, missing, active
}

// diskErrors sums each active disk's bad blocks, timeouts and stalls over the members it
// holds; a disk with none is left out.
func diskErrors(ps pool.Status) []string {
	type errs struct{ bad, timedOut, stalls uint64 }
	per := map[string]*errs{}
	for _, v := range ps.Volumes {
		for _, m := range v.Members {
			if m.DiskUUID == "" || (m.BadBlocks == 0 && m.TimedOut == 0 && m.SlowLastCopy == 0) {
				continue
			}
			e := per[m.DiskUUID]
			if e == nil {
				e = &errs{}
				per[m.DiskUUID] = e
			}
			e.bad += uint64(m.BadBlocks)
			e.timedOut += m.TimedOut
			e.stalls += m.SlowLastCopy
		}
	}
	var out []string
	for _, d := range ps.Disks {
		if e := per[d.UUID]; e != nil && d.Status == pool.StatusActive {
			out = append(out, fmt.Sprintf("disk %s: %d bad blocks, %d requests past the member deadline, %d stalls waited for (it held the last copy, or its mirror was late too)",
				diskLabel(d), e.bad, e.timedOut, e.stalls))
		}
	}
	return out
}

// volumesNotRedundant names the volumes that are not Healthy, grouped by health.
func volumesNotRedundant(vols []pool.VolumeInfo) []string {
	by := map[pool.Health][]string{}
	for _, v := range vols {
		if v.Health != pool.Healthy {
			by[v.Health] = append(by[v.Health], v.Name)
		}
	}
	var out []string
	for _, h := range []pool.Health{pool.Failed, pool.Degraded, pool.Rebuilding} {
		if names := by[h]; len(names) > 0 {
			sort.Strings(names)
			out = append(out, fmt.Sprintf("%d volumes %s: %s", len(names), h, strings.Join(names, ", ")))
		}
	}
	return out
}

// poolSummary is the pool's disks, spares and capacity in one sentence.
func poolSummary(ps pool.Status) string {
	count := map[pool.DiskStatus]int{}
	for _, d := range ps.Disks {
		count[d.Status]++
	}
	c := ps.Capacity
	return fmt.Sprintf("Pool %s: %d active, %d spare, %d failed, %d missing, %d refused disks; hot-spare capacity %d bytes held in reserve; "+
		"free %d of %d usable bytes (%d of %d raw), largest new volume %d bytes",
		ps.Name, count[pool.StatusActive], count[pool.StatusSpare], count[pool.StatusFailed], count[pool.StatusMissing],
		count[pool.StatusRefused], c.Spare, c.FreeUsable, c.Usable, c.FreeRaw, c.Raw, c.LargestVolume)
}

// diskLabel names a disk by its path and, when it has one, its identity or pool UUID.
func diskLabel(d pool.DiskInfo) string {
	id := d.Identity
	if id == "" {
		id = d.UUID
	}
	switch {
	case d.Path == "":
		return id
	case id == "":
		return d.Path
	}
	return d.Path + " (" + id + ")"
}
