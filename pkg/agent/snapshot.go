package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// snapshotCopyPoll is how often a snapshot whose copy runs is looked at again even without
// a change the poller noticed (the poller enqueues every whole percent).
const snapshotCopyPoll = 10 * time.Second

// reconcileSnapshot brings one Raid10Snapshot and the pool together: cut (idempotent by
// name), report the copy's progress, delete through the finalizer.
//
// A snapshot is cut once. One that was cut (status.cutAt) and is then missing from the pool
// is reported Failed (NotInPool), never cut again: a new cut would be another point in time
// under the same name.
func (a *Agent) reconcileSnapshot(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := klog.FromContext(ctx).WithValues("snapshotID", req.Name, "nodeID", a.node)
	var snap v1alpha1.Raid10Snapshot
	if err := a.c.Get(ctx, req.NamespacedName, &snap); err != nil {
		if apierrors.IsNotFound(err) {
			a.forgetSnapshot(req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if snap.Spec.Node != a.node {
		return reconcile.Result{}, nil
	}
	if snap.DeletionTimestamp != nil {
		return a.deleteSnapshot(ctx, &snap)
	}
	if !controllerutil.ContainsFinalizer(&snap, v1alpha1.VolumeFinalizer) {
		controllerutil.AddFinalizer(&snap, v1alpha1.VolumeFinalizer)
		if err := a.c.Update(ctx, &snap); err != nil {
			return requeueOnConflict(err)
		}
	}
	now := time.Now()
	prev := snap.Status

	info, err := a.pool.Snapshot(snap.Name)
	switch {
	case errors.Is(err, pool.ErrNotFound) && prev.CutAt != nil:
		msg := "the snapshot was cut but is not in the node's pool (its disks are missing or were replaced)"
		return a.writeSnapshotStatus(ctx, &snap, crstatus.SnapshotFailedStatus(prev, &snap, crstatus.ReasonNotInPool, msg, now))
	case errors.Is(err, pool.ErrNotFound) && prev.Phase == v1alpha1.SnapshotPhaseFailed && prev.ObservedGeneration == snap.Generation:
		return reconcile.Result{}, nil // refused already; the controller deletes it
	case errors.Is(err, pool.ErrNotFound):
		info, err = a.pool.CreateSnapshot(snap.Name, snap.Spec.Source)
		if err != nil {
			reason, final := crstatus.CreateFailedReason(err)
			if !final {
				logger.Error(err, "Cutting the snapshot")
				return reconcile.Result{}, err
			}
			logger.Error(err, "Snapshot cannot be cut", "reason", reason, "source", snap.Spec.Source)
			a.event(&snap, corev1.EventTypeWarning, EventSnapshotFailed, "Cut", "%v", err)
			return a.writeSnapshotStatus(ctx, &snap, crstatus.SnapshotFailedStatus(prev, &snap, reason, err.Error(), now))
		}
		logger.Info("Snapshot cut", "source", snap.Spec.Source, "cutAt", info.CutAt, "size", info.Size, "members", info.Members)
		a.event(&snap, corev1.EventTypeNormal, EventSnapshotCut, "Cut", "volume %s cut at %s: %d bytes over %d members on node %s; copying",
			snap.Spec.Source, info.CutAt.UTC().Format(time.RFC3339Nano), info.Size, info.Members, a.node)
		a.enqueueNode()
	case err != nil:
		return reconcile.Result{}, err
	}

	st := crstatus.SnapshotStatus(prev, &snap, info, now)
	if prev.CutAt == nil && st.CutAt != nil {
		if r, err := a.reportAllocation(ctx); err != nil || r.RequeueAfter > 0 {
			return r, err
		}
	}
	a.snapshotEvents(&snap, prev, st)
	r, err := a.writeSnapshotStatus(ctx, &snap, st)
	if err != nil || r.RequeueAfter > 0 {
		return r, err
	}
	if !st.ReadyToUse && st.Phase != v1alpha1.SnapshotPhaseFailed {
		return reconcile.Result{RequeueAfter: snapshotCopyPoll}, nil
	}
	return reconcile.Result{}, nil
}

// snapshotEvents records SnapshotReady (and SnapshotFailed for lost data) once per change.
func (a *Agent) snapshotEvents(snap *v1alpha1.Raid10Snapshot, prev, st v1alpha1.Raid10SnapshotStatus) {
	a.mu.Lock()
	ready, ok := a.snapSeen[snap.Name]
	if !ok {
		ready = prev.ReadyToUse
	}
	a.snapSeen[snap.Name] = st.ReadyToUse
	a.mu.Unlock()
	if st.ReadyToUse && !ready {
		a.event(snap, corev1.EventTypeNormal, EventSnapshotReady, "Copy", "%d bytes copied: the snapshot of %s as of %s is independent of its source",
			st.SizeBytes, snap.Spec.Source, st.CutAt.UTC().Format(time.RFC3339Nano))
	}
	if st.Phase == v1alpha1.SnapshotPhaseFailed && prev.Phase != v1alpha1.SnapshotPhaseFailed {
		a.event(snap, corev1.EventTypeWarning, EventSnapshotFailed, "Monitor", "%s", st.Message)
	}
}

// writeSnapshotStatus writes st as snap's status when it differs; a conflict requeues.
func (a *Agent) writeSnapshotStatus(ctx context.Context, snap *v1alpha1.Raid10Snapshot, st v1alpha1.Raid10SnapshotStatus) (reconcile.Result, error) {
	if equality.Semantic.DeepEqual(snap.Status, st) {
		return reconcile.Result{}, nil
	}
	snap.Status = st
	if err := a.c.Status().Update(ctx, snap); err != nil {
		return requeueOnConflict(err)
	}
	return reconcile.Result{}, nil
}

// deleteSnapshot frees the extents of a snapshot being deleted, then removes the finalizer.
// While the pool refuses (a restore still copies from it) the object shows why (phase
// Deleting, message, a DeleteWaiting Event) and the agent tries again.
func (a *Agent) deleteSnapshot(ctx context.Context, snap *v1alpha1.Raid10Snapshot) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(snap, v1alpha1.VolumeFinalizer) {
		return reconcile.Result{}, nil
	}
	logger := klog.FromContext(ctx).WithValues("snapshotID", snap.Name, "nodeID", a.node)
	_, err := a.pool.Snapshot(snap.Name)
	existed := err == nil
	if err := a.pool.DeleteSnapshot(snap.Name); err != nil {
		if errors.Is(err, pool.ErrFailedPrecondition) {
			msg := fmt.Sprintf("delete waits: %v", err)
			logger.Info("Snapshot delete waits", "reason", err.Error())
			if snap.Status.Message != msg {
				a.event(snap, corev1.EventTypeWarning, EventDeleteWaiting, "Delete", "%s", msg)
			}
			if _, werr := a.writeSnapshotStatus(ctx, snap, crstatus.SnapshotDeleteWaiting(snap.Status, msg)); werr != nil {
				return reconcile.Result{}, werr
			}
			return reconcile.Result{RequeueAfter: deleteWaitRetry}, nil
		}
		logger.Error(err, "Freeing the snapshot's extents")
		a.event(snap, corev1.EventTypeWarning, EventDeleteFailed, "Delete", "%v", err)
		return reconcile.Result{}, err
	}
	if existed {
		logger.Info("Snapshot deleted, extents freed")
		a.event(snap, corev1.EventTypeNormal, EventSnapshotDeleted, "Delete", "extents freed on node %s", a.node)
		a.enqueueNode()
	}
	controllerutil.RemoveFinalizer(snap, v1alpha1.VolumeFinalizer)
	if err := a.c.Update(ctx, snap); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return requeueOnConflict(err)
	}
	a.forgetSnapshot(snap.Name)
	return reconcile.Result{}, nil
}

func (a *Agent) forgetSnapshot(name string) {
	a.mu.Lock()
	delete(a.snapSeen, name)
	a.mu.Unlock()
}
