package agent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// Event reasons of a disk replacement request (on the Raid10Node).
const (
	EventDiskReplaced      = "DiskReplaced"
	EventDiskReplaceFailed = "DiskReplaceFailed"
)

// replaceDisk carries out n's spec.diskReplacement when its generation has not been acted
// on yet, and returns the status.lastDiskReplacement to report (n's own when there was
// nothing to do). Refusals are reported as Failed, never retried by the agent: the operator
// asks again with a new request (a new generation).
//
// A request whose outcome the agent did not get to write (a crash or a lost write right
// after pool.ReplaceDisk) comes back with the old disk already Removed and the new one in
// the pool: that is reported Succeeded, not as the pool's "already replaced" refusal.
func (a *Agent) replaceDisk(ctx context.Context, n *v1alpha1.Raid10Node) *v1alpha1.DiskReplacementStatus {
	req, last := n.Spec.DiskReplacement, n.Status.LastDiskReplacement
	if req == nil || (last != nil && last.ObservedGeneration == n.Generation) {
		return last
	}
	logger := klog.FromContext(ctx).WithValues("nodeID", a.node, "disk", req.OldDisk, "newPath", req.NewPath)
	st := &v1alpha1.DiskReplacementStatus{
		ObservedGeneration: n.Generation, OldDisk: req.OldDisk, NewPath: req.NewPath,
		Time: metav1.NewTime(time.Now().Truncate(time.Second)),
	}
	ps := a.pool.Status()
	ids := crstatus.DiskIDs(ps.Disks)
	old, found := findPoolDisk(ps.Disks, ids, req.OldDisk)
	newDisk, newFound := findPoolDisk(ps.Disks, ids, req.NewPath)
	var err error
	switch {
	case found && old.Status == pool.StatusRemoved && newFound && newDisk.Status != pool.StatusRemoved:
		// Done before the outcome was written.
	case !found:
		err = fmt.Errorf("%w: disk %q is not in the pool of node %s", pool.ErrNotFound, req.OldDisk, a.node)
	default:
		// The pool resolves the reference itself (UUID, path or serial/WWN); the Raid10Node's
		// id of a file disk is its UUID, so every id the status lists is understood.
		ref := old.Path
		if old.UUID != "" {
			ref = old.UUID
		}
		var d pool.DiskInfo
		d, err = a.pool.ReplaceDisk(ref, pool.DiskConfig{Path: req.NewPath, Wipe: req.Wipe})
		newDisk = d
	}
	if err != nil {
		st.Result, st.Message = v1alpha1.DiskReplacementFailed, err.Error()
		logger.Error(err, "Disk replacement refused")
		a.event(n, corev1.EventTypeWarning, EventDiskReplaceFailed, "ReplaceDisk", "disk %s with %s: %v", req.OldDisk, req.NewPath, err)
		return st
	}
	st.Result = v1alpha1.DiskReplacementSucceeded
	st.NewDisk = crstatus.DiskIDs(a.pool.Status().Disks)[crstatus.DiskKey(newDisk)]
	// Every volume with a member on the new disk rebuilds onto it (a fresh disk holds no
	// other member). A small volume's rebuild may already be over when the status is read:
	// it is listed and counted too, with how many are done.
	var rebuilding []string
	done := 0
	for _, v := range a.pool.Status().Volumes {
		for _, m := range v.Members {
			if m.DiskUUID == newDisk.UUID {
				rebuilding = append(rebuilding, v.Name)
				if m.State == "in-sync" {
					done++
				}
				break
			}
		}
	}
	st.RebuildingVolumes = rebuilding
	st.Message = fmt.Sprintf("disk %s replaced by %s (%s); ", req.OldDisk, req.NewPath, crstatus.OrDash(st.NewDisk)) +
		rebuildMessage(len(rebuilding), done)
	logger.Info("Disk replaced", "newDisk", st.NewDisk, "rebuilding", len(rebuilding), "alreadyInSync", done)
	a.event(n, corev1.EventTypeNormal, EventDiskReplaced, "ReplaceDisk", "%s", st.Message)
	a.enqueueNode()
	for _, v := range rebuilding {
		a.enqueueVolume(v)
	}
	return st
}

// rebuildMessage says how many volumes rebuild onto a new disk, n, of which done are
// already in sync: "3 volumes rebuild onto it (1 already in sync)".
func rebuildMessage(n, done int) string {
	msg := fmt.Sprintf("%d volumes rebuild onto it", n)
	if n == 1 {
		msg = "1 volume rebuilds onto it"
	}
	if done > 0 {
		msg += fmt.Sprintf(" (%d already in sync)", done)
	}
	return msg
}

// findPoolDisk finds the disk an operator's reference names: its Raid10Node id (ids, by
// diskKey), UUID, path or identity. Removed disks are found too, after the others.
func findPoolDisk(disks []pool.DiskInfo, ids map[string]string, ref string) (pool.DiskInfo, bool) {
	var removed *pool.DiskInfo
	for i, d := range disks {
		if ids[crstatus.DiskKey(d)] == ref || (d.UUID != "" && d.UUID == ref) || d.Path == ref || (d.Identity != "" && d.Identity == ref) {
			if d.Status != pool.StatusRemoved {
				return d, true
			}
			if removed == nil {
				removed = &disks[i]
			}
		}
	}
	if removed != nil {
		return *removed, true
	}
	return pool.DiskInfo{}, false
}
