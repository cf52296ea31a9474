package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// expandRetry is how soon an expansion that the pool refused for now (not Healthy, no room
// after the extents) is tried again; a health change retries it sooner through the poller.
const expandRetry = 15 * time.Second

// conflictRetry is how soon a reconcile that lost a write to a newer object runs again (the
// cache catches up within milliseconds).
const conflictRetry = 50 * time.Millisecond

// reconcileVolume brings one Raid10Volume and the pool together: create (idempotent by
// name), expand, delete through the finalizer, and report status.
func (a *Agent) reconcileVolume(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := klog.FromContext(ctx).WithValues("volumeID", req.Name, "nodeID", a.node)
	var vol v1alpha1.Raid10Volume
	if err := a.c.Get(ctx, req.NamespacedName, &vol); err != nil {
		if apierrors.IsNotFound(err) {
			a.forgetVolume(req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if vol.Spec.Node != a.node {
		return reconcile.Result{}, nil
	}
	if vol.DeletionTimestamp != nil {
		return a.deleteVolume(ctx, &vol)
	}
	// A volume without the finalizer (made by hand) gets it before it gets extents, so that
	// deleting it frees them.
	if !controllerutil.ContainsFinalizer(&vol, v1alpha1.VolumeFinalizer) {
		controllerutil.AddFinalizer(&vol, v1alpha1.VolumeFinalizer)
		if err := a.c.Update(ctx, &vol); err != nil {
			return requeueOnConflict(err)
		}
	}
	now := time.Now()
	prev := vol.Status
	var result reconcile.Result

	info, err := a.pool.Volume(vol.Name)
	switch {
	case errors.Is(err, pool.ErrNotFound) && prev.Capacity != nil:
		// It held data once: never replace it with a blank volume of the same name.
		msg := "the volume was provisioned but is not in the node's pool (its disks are missing or were replaced)"
		return a.writeVolumeStatus(ctx, &vol, crstatus.FailedStatus(prev, &vol, crstatus.ReasonNotInPool, msg, now))
	case errors.Is(err, pool.ErrNotFound) && prev.Phase == v1alpha1.VolumePhaseFailed && prev.ObservedGeneration == vol.Generation:
		return reconcile.Result{}, nil // failed for this spec already; a new spec retries
	case errors.Is(err, pool.ErrNotFound):
		info, err = a.pool.CreateVolume(vol.Name, uint64(vol.Spec.SizeBytes), crstatus.CreateOptions(&vol))
		if err != nil {
			reason, final := crstatus.CreateFailedReason(err)
			if !final {
				// I/O errors, a closed pool: retry with backoff.
				logger.Error(err, "Creating the volume in the pool")
				return reconcile.Result{}, err
			}
			logger.Error(err, "Volume cannot be provisioned", "reason", reason)
			a.event(&vol, corev1.EventTypeWarning, EventProvisionFailed, "Provision", "%v", err)
			return a.writeVolumeStatus(ctx, &vol, crstatus.FailedStatus(prev, &vol, reason, err.Error(), now))
		}
		logger.Info("Volume provisioned", "size", info.Size, "members", len(info.Members), "chunkSize", info.ChunkSize, "source", describeSource(vol.Spec.Source))
		a.event(&vol, corev1.EventTypeNormal, EventProvisioned, "Provision",
			"%d bytes over %d members on node %s%s", info.Size, len(info.Members), a.node, prefixed(", from ", describeSource(vol.Spec.Source)))
		a.enqueueNode()
	case err != nil:
		return reconcile.Result{}, err
	}

	expandMsg := ""
	if want := uint64(vol.Spec.SizeBytes); info.Size < want {
		grown, err := a.pool.ExpandVolume(vol.Name, want)
		switch {
		case err == nil:
			logger.Info("Volume expanded", "from", info.Size, "to", grown.Size)
			a.event(&vol, corev1.EventTypeNormal, EventExpanded, "Expand", "from %d to %d bytes", info.Size, grown.Size)
			info = grown
			a.enqueueNode()
		case errors.Is(err, pool.ErrDegraded), errors.Is(err, pool.ErrNoSpace), errors.Is(err, pool.ErrInvalidArgument),
			errors.Is(err, pool.ErrFailedPrecondition): // e.g. an engine that cannot grow a running array
			expandMsg = fmt.Sprintf("expansion to %d bytes pending: %v", want, err)
			result.RequeueAfter = expandRetry
		default:
			logger.Error(err, "Expanding the volume", "size", want)
			return reconcile.Result{}, err
		}
	}

	if sc := prev.Scrub; sc != nil && sc.LastCompletedTime != nil && (info.Scrub == nil || info.Scrub.LastCompleted == nil) {
		// The pool keeps no record of scrubs across restarts; the status does.
		if err := a.pool.RecordScrubCompleted(vol.Name, sc.LastCompletedTime.Time); err != nil {
			logger.Error(err, "Restoring the last scrub's completion")
		}
	}
	st := crstatus.VolumeStatus(prev, &vol, info, crstatus.DiskIDs(a.pool.Status().Disks), now)
	st.Limits, result = a.applyLimits(ctx, &vol, prev.Limits, result)
	st.Rates, result = a.applyRates(ctx, &vol, prev.Rates, result)
	st.ScrubSchedule, result = a.applyScrubSchedule(ctx, &vol, prev.ScrubSchedule, result)
	if a.devices != nil {
		st.DevicePath = a.devices.Device(vol.Name)
		st.Frontend = frontendOf(st.DevicePath)
		if fd, ok := a.devices.(frontendDescriber); ok && st.Frontend != "" {
			st.Frontend = fd.Frontend(vol.Name)
		}
		if st.DevicePath != "" {
			// The device follows the array: after a growth (here or by an earlier pass whose
			// resize failed) the kernel learns the new size in place.
			if _, err := a.devices.Expand(ctx, vol.Name); err != nil {
				logger.Error(err, "Growing the volume's device", "device", st.DevicePath)
				result.RequeueAfter = expandRetry
			}
		}
	}
	if expandMsg != "" {
		st = crstatus.ExpandPending(st, expandMsg)
	}
	st = a.requestedScrub(ctx, &vol, st)
	if capacityOf(st) > capacityOf(prev) {
		if r, err := a.reportAllocation(ctx); err != nil || r.RequeueAfter > 0 {
			return r, err
		}
	}
	a.volumeEvents(&vol, prev, st, expandMsg)
	r, err := a.writeVolumeStatus(ctx, &vol, st)
	if err != nil || r.RequeueAfter > 0 {
		return r, err
	}
	return result, nil
}

// volumeEvents records the Events for the change from what was last reported to st.
func (a *Agent) volumeEvents(vol *v1alpha1.Raid10Volume, prev, st v1alpha1.Raid10VolumeStatus, expandMsg string) {
	a.mu.Lock()
	seen, ok := a.volumeSeen[vol.Name]
	if !ok {
		// First sight since the agent started: what the object says was reported.
		seen = volumeSeen{health: prev.Health, rebuilding: prev.Rebuild != nil, badBlocks: prev.BadBlocks, lostBlocks: prev.LostBlocks,
			scrub: scrubSeen(prev.Scrub)}
		if prev.Phase == v1alpha1.VolumePhaseExpanding && expandMsg != "" && strings.HasPrefix(prev.Message, expandMsg) {
			seen.expandMsg = expandMsg
		}
	}
	a.volumeSeen[vol.Name] = volumeSeen{health: st.Health, rebuilding: st.Rebuild != nil, expandMsg: expandMsg,
		badBlocks: st.BadBlocks, lostBlocks: st.LostBlocks, scrub: scrubSeen(st.Scrub)}
	a.mu.Unlock()

	a.scrubEvents(vol, seen.scrub, st.Scrub)

	if h := st.Hydration; h != nil && h.Hydrated && (prev.Hydration == nil || !prev.Hydration.Hydrated) {
		a.event(vol, corev1.EventTypeNormal, EventHydrated, "Copy", "%d bytes copied from %s: the volume no longer needs its source",
			h.TotalBytes, describeSource(vol.Spec.Source))
	}

	// Only growth is news: a count that falls (the blocks were rewritten) needs no warning.
	if st.BadBlocks > seen.badBlocks || st.LostBlocks > seen.lostBlocks {
		var per []string
		for _, m := range st.Members {
			if m.BadBlocks > 0 {
				per = append(per, fmt.Sprintf("member %d (disk %s): %d", m.Index, crstatus.OrDash(m.Disk), m.BadBlocks))
			}
		}
		a.event(vol, corev1.EventTypeWarning, EventBadBlocks, "Monitor", "%d bad blocks (was %d), %d lost (was %d)%s",
			st.BadBlocks, seen.badBlocks, st.LostBlocks, seen.lostBlocks, prefixed(": ", strings.Join(per, ", ")))
	}

	if st.Health != seen.health {
		switch st.Health {
		case v1alpha1.VolumeHealthDegraded:
			a.event(vol, corev1.EventTypeWarning, EventDegraded, "Monitor", "%s members in sync: %s", st.InSync, st.Message)
		case v1alpha1.VolumeHealthFailed:
			a.event(vol, corev1.EventTypeWarning, EventVolumeFailed, "Monitor", "%s members in sync: %s", st.InSync, st.Message)
		case v1alpha1.VolumeHealthHealthy:
			if seen.rebuilding || seen.health == v1alpha1.VolumeHealthRebuilding {
				a.event(vol, corev1.EventTypeNormal, EventRebuildFinished, "Rebuild", "every member in sync (%s)", st.InSync)
			}
		}
	}
	if st.Rebuild != nil && !seen.rebuilding {
		disk := ""
		for _, m := range st.Members {
			if m.Index == st.Rebuild.Member {
				disk = m.Disk
			}
		}
		a.event(vol, corev1.EventTypeNormal, EventRebuildStarted, "Rebuild", "member %d onto disk %s: %d bytes",
			st.Rebuild.Member, crstatus.OrDash(disk), st.Rebuild.TotalBytes)
	}
	if expandMsg != "" && expandMsg != seen.expandMsg {
		a.event(vol, corev1.EventTypeWarning, EventExpandFailed, "Expand", "%s", expandMsg)
	}
}

// writeVolumeStatus writes st as vol's status when it differs. A conflict (the cache was
// behind) requeues without an error.
func (a *Agent) writeVolumeStatus(ctx context.Context, vol *v1alpha1.Raid10Volume, st v1alpha1.Raid10VolumeStatus) (reconcile.Result, error) {
	if equality.Semantic.DeepEqual(vol.Status, st) {
		return reconcile.Result{}, nil
	}
	vol.Status = st
	if err := a.c.Status().Update(ctx, vol); err != nil {
		return requeueOnConflict(err)
	}
	return reconcile.Result{}, nil
}

// deleteWaitRetry is how often a delete that waits for the volume's device to be detached
// looks again.
const deleteWaitRetry = 10 * time.Second

// deleteVolume frees the extents of a volume being deleted, then removes the finalizer. A
// volume still attached to a device (staged: a filesystem may be mounted on it) is not
// touched: the delete waits until the node service has unstaged it, so that a mistaken
// delete of the object (kubectl delete r10v, a DeleteVolume racing an unmount) can never
// destroy data in use.
func (a *Agent) deleteVolume(ctx context.Context, vol *v1alpha1.Raid10Volume) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(vol, v1alpha1.VolumeFinalizer) {
		return reconcile.Result{}, nil
	}
	logger := klog.FromContext(ctx).WithValues("volumeID", vol.Name, "nodeID", a.node)
	if a.devices != nil {
		if dev := a.devices.Device(vol.Name); dev != "" {
			logger.Info("Delete waits: the volume is attached", "device", dev)
			a.event(vol, corev1.EventTypeWarning, EventDeleteWaiting, "Delete",
				"volume is attached as %s on node %s (staged); it is deleted once unstaged", dev, a.node)
			return reconcile.Result{RequeueAfter: deleteWaitRetry}, nil
		}
	}
	_, err := a.pool.Volume(vol.Name)
	existed := err == nil
	if err := a.pool.DeleteVolume(vol.Name); err != nil {
		if errors.Is(err, pool.ErrFailedPrecondition) {
			// A clone or a snapshot still copies from it: the pool frees it afterwards.
			logger.Info("Delete waits", "reason", err.Error())
			a.event(vol, corev1.EventTypeWarning, EventDeleteWaiting, "Delete", "delete waits: %v", err)
			return reconcile.Result{RequeueAfter: deleteWaitRetry}, nil
		}
		logger.Error(err, "Freeing the volume's extents")
		a.event(vol, corev1.EventTypeWarning, EventDeleteFailed, "Delete", "%v", err)
		return reconcile.Result{}, err
	}
	if existed {
		logger.Info("Volume deleted, extents freed")
		a.event(vol, corev1.EventTypeNormal, EventDeleted, "Delete", "extents freed on node %s", a.node)
		a.enqueueNode()
	}
	controllerutil.RemoveFinalizer(vol, v1alpha1.VolumeFinalizer)
	if err := a.c.Update(ctx, vol); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return requeueOnConflict(err)
	}
	a.forgetVolume(vol.Name)
	return reconcile.Result{}, nil
}

func (a *Agent) forgetVolume(name string) {
	a.mu.Lock()
	delete(a.volumeSeen, name)
	delete(a.limits, name)
	delete(a.rates, name)
	delete(a.scrubSchedules, name)
	a.mu.Unlock()
}

// reconcileNode creates the node's Raid10Node when missing and writes its status from the
// pool.
func (a *Agent) reconcileNode(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Name != a.node {
		return reconcile.Result{}, nil
	}
	var n v1alpha1.Raid10Node
	err := a.c.Get(ctx, req.NamespacedName, &n)
	if apierrors.IsNotFound(err) {
		n = v1alpha1.Raid10Node{}
		n.Name = a.node
		if err := a.c.Create(ctx, &n); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, fmt.Errorf("create Raid10Node %s: %w", a.node, err)
		} else if err != nil {
			return reconcile.Result{RequeueAfter: conflictRetry}, nil // created meanwhile; read it
		}
		klog.FromContext(ctx).Info("Raid10Node created", "nodeID", a.node)
	} else if err != nil {
		return reconcile.Result{}, err
	}
	return a.writeNodeStatus(ctx, &n, a.replaceDisk(ctx, &n))
}

// writeNodeStatus writes the pool's state as n's status, with last as the outcome of the
// last disk replacement, when it differs; disk Events are recorded once per transition
// (nodeEvents). A conflict requeues without an error.
func (a *Agent) writeNodeStatus(ctx context.Context, n *v1alpha1.Raid10Node, last *v1alpha1.DiskReplacementStatus) (reconcile.Result, error) {
	st := crstatus.NodeStatus(n.Status, a.pool.Status(), a.pool.MemberFree(), time.Now())
	st.LastDiskReplacement = last
	a.nodeEvents(n, st)
	if equality.Semantic.DeepEqual(n.Status, st) {
		return reconcile.Result{}, nil
	}
	n.Status = st
	if err := a.c.Status().Update(ctx, n); err != nil {
		return requeueOnConflict(err)
	}
	return reconcile.Result{}, nil
}

// reportAllocation writes the pool's free space into the Raid10Node now, before the caller
// reports an allocation (a volume's first or larger capacity, a snapshot's cut). The
// controller reads both objects straight from the API server and admits a request on the
// node's free bytes less what is not allocated yet: were the allocation visible before the
// bytes it took, a second request would be admitted on bytes already gone (the pool would
// still refuse it, but late, as a failed object). A conflict requeues the caller, whose
// status is then still unwritten.
func (a *Agent) reportAllocation(ctx context.Context) (reconcile.Result, error) {
	var n v1alpha1.Raid10Node
	if err := a.c.Get(ctx, client.ObjectKey{Name: a.node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil // the node reconcile creates it with the free space
		}
		return reconcile.Result{}, err
	}
	return a.writeNodeStatus(ctx, &n, n.Status.LastDiskReplacement)
}

// capacityOf is the capacity a volume status reports, 0 before it has one.
func capacityOf(st v1alpha1.Raid10VolumeStatus) int64 {
	if st.Capacity == nil {
		return 0
	}
	return st.Capacity.Value()
}

// nodeEvents records DiskFailed (and DiskHealthy when a disk returns) on the Raid10Node.
func (a *Agent) nodeEvents(n *v1alpha1.Raid10Node, st v1alpha1.Raid10NodeStatus) {
	a.mu.Lock()
	seen := a.diskSeen
	if seen == nil {
		seen = map[string]v1alpha1.DiskState{}
		for _, d := range n.Status.Disks {
			seen[d.ID] = d.State
		}
	}
	a.diskSeen = map[string]v1alpha1.DiskState{}
	for _, d := range st.Disks {
		a.diskSeen[d.ID] = d.State
	}
	a.mu.Unlock()
	for _, d := range st.Disks {
		old, known := seen[d.ID]
		switch {
		case d.State == v1alpha1.DiskStateFailed && old != v1alpha1.DiskStateFailed:
			a.event(n, corev1.EventTypeWarning, EventDiskFailed, "Monitor", "disk %s (%s): %s", d.ID, d.Path, d.Message)
		case d.State == v1alpha1.DiskStateHealthy && known && old != v1alpha1.DiskStateHealthy:
			a.event(n, corev1.EventTypeNormal, EventDiskReturned, "Monitor", "disk %s (%s) is healthy", d.ID, d.Path)
		}
	}
}

// prefixed is p+s, or empty when s is.
func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func (a *Agent) event(obj client.Object, eventtype, reason, action, note string, args ...any) {
	if a.rec == nil {
		return
	}
	a.rec.Eventf(obj, nil, eventtype, reason, action, note, args...)
}

// requeueOnConflict turns a conflict (a stale cached object) into a quiet requeue.
func requeueOnConflict(err error) (reconcile.Result, error) {
	if apierrors.IsConflict(err) {
		return reconcile.Result{RequeueAfter: conflictRetry}, nil
	}
	return reconcile.Result{}, err
}

// frontendDescriber is Devices that also describe a volume's frontend for its status
// (attach.PoolAttacher: "nbd", or "ublk" with the kernel's newer ublk features).
type frontendDescriber interface {
	// Frontend describes how the volume is served, "" when it is not attached.
	Frontend(volumeID string) string
}

// frontendOf names the frontend of a device path for the status: "ublk" for /dev/ublkbN,
// "nbd" for /dev/nbdX, "" for none.
func frontendOf(device string) string {
	switch {
	case strings.HasPrefix(device, "/dev/ublkb"):
		return "ublk"
	case strings.HasPrefix(device, "/dev/nbd"):
		return "nbd"
	}
	return ""
}

// describeSource names a volume's source ("snapshot X", "volume Y"), "" for none.
func describeSource(s *v1alpha1.VolumeSource) string {
	switch {
	case s == nil:
		return ""
	case s.Snapshot != "":
		return "snapshot " + s.Snapshot
	}
	return "volume " + s.Volume
}
