package crstatus

import (
	"fmt"
	"math"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// Ready condition reasons of a Raid10Snapshot (besides v1alpha1.ReasonInsufficientCapacity,
// v1alpha1.ReasonSourceNotFound, ReasonCreateFailed and ReasonNotInPool).
const (
	ReasonCopying = "Copying" // False: cut, the copy runs
	ReasonCopied  = "Copied"  // True: every byte copied
)

// percentOf is done/total in whole percent, 0 to 100 (100 for an empty total).
func percentOf(done, total uint64) int32 {
	if total == 0 {
		return 100
	}
	return int32(math.Min(100, math.Floor(float64(done)*100/float64(total))))
}

// hydrationStatus is the copy progress of a restored or cloned volume; nil for a volume
// made blank.
func hydrationStatus(vol *v1alpha1.Raid10Volume, info pool.VolumeInfo) *v1alpha1.HydrationStatus {
	if vol.Spec.Source == nil && info.Source == nil {
		return nil
	}
	h := &v1alpha1.HydrationStatus{Hydrated: info.Hydrated, CopiedBytes: int64(info.Copied), TotalBytes: int64(info.Size)}
	if info.Hydrated {
		h.CopiedBytes = h.TotalBytes
	}
	h.Percent = percentOf(uint64(h.CopiedBytes), uint64(h.TotalBytes))
	if !info.Hydrated && h.Percent == 100 {
		h.Percent = 99 // 100 only once the pool says so
	}
	return h
}

// SnapshotStatus is the status of snap for the pool's view info (a snapshot that is cut).
// prev is the status the object has; now stamps new conditions.
func SnapshotStatus(prev v1alpha1.Raid10SnapshotStatus, snap *v1alpha1.Raid10Snapshot, info pool.SnapshotInfo, now time.Time) v1alpha1.Raid10SnapshotStatus {
	cut := metav1.NewTime(info.CutAt)
	st := v1alpha1.Raid10SnapshotStatus{
		ObservedGeneration: snap.Generation,
		Phase:              v1alpha1.SnapshotPhaseCopying,
		CutAt:              &cut,
		ReadyToUse:         info.Ready,
		SizeBytes:          int64(info.Size),
		Size:               resource.NewQuantity(int64(info.Size), resource.BinarySI),
		CopiedBytes:        int64(info.Copied),
		Health:             v1alpha1.VolumeHealth(info.Health),
		Members:            int32(info.Members),
		Conditions:         slices.Clone(prev.Conditions),
	}
	if info.Ready {
		st.Phase, st.CopiedBytes = v1alpha1.SnapshotPhaseReady, int64(info.Size)
	}
	st.Percent = percentOf(uint64(st.CopiedBytes), info.Size)
	if !info.Ready && st.Percent == 100 {
		st.Percent = 99
	}
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonCopying,
		Message:            fmt.Sprintf("cut at %s; copying the source's data as of the cut: %d%% of %d bytes", info.CutAt.UTC().Format(time.RFC3339Nano), st.Percent, info.Size),
		ObservedGeneration: snap.Generation}
	if info.Ready {
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonCopied
		cond.Message = fmt.Sprintf("cut at %s, %d bytes copied: independent of its source", info.CutAt.UTC().Format(time.RFC3339Nano), info.Size)
	}
	if info.Health == pool.Failed {
		st.Phase = v1alpha1.SnapshotPhaseFailed
		st.Message = "the snapshot's extents lost data (both copies of some chunk)"
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonArrayFailed, st.Message
	}
	setCondition(&st.Conditions, cond, now)
	return st
}

// SnapshotFailedStatus is the status of a snapshot the pool cannot provide: phase Failed,
// Ready False with reason and message. The cut, if there was one, stays.
func SnapshotFailedStatus(prev v1alpha1.Raid10SnapshotStatus, snap *v1alpha1.Raid10Snapshot, reason, msg string, now time.Time) v1alpha1.Raid10SnapshotStatus {
	st := *prev.DeepCopy()
	st.ObservedGeneration = snap.Generation
	st.Phase = v1alpha1.SnapshotPhaseFailed
	st.ReadyToUse = false
	st.Message = msg
	setCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg,
		ObservedGeneration: snap.Generation,
	}, now)
	return st
}

// SnapshotDeleteWaiting is the status of a deleted snapshot whose extents the pool will not
// free yet (a restore still copies from it): phase Deleting, msg says why.
func SnapshotDeleteWaiting(prev v1alpha1.Raid10SnapshotStatus, msg string) v1alpha1.Raid10SnapshotStatus {
	st := *prev.DeepCopy()
	st.Phase = v1alpha1.SnapshotPhaseDeleting
	st.Message = msg
	return st
}
