package crstatus

import (
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// ScrubStatus is the Raid10Volume's status.scrub for the pool's scrub state in; without
// one (none since the pool opened) it keeps prev, so the last scrub stays on record across
// restarts of the agent.
func ScrubStatus(prev *v1alpha1.ScrubStatus, in *pool.ScrubInfo) *v1alpha1.ScrubStatus {
	if in == nil {
		return prev.DeepCopy()
	}
	t := func(tm time.Time) *metav1.Time {
		mt := metav1.NewTime(tm.Truncate(time.Second)) // what the API server keeps: no churn
		return &mt
	}
	st := &v1alpha1.ScrubStatus{
		State: v1alpha1.ScrubState(in.State), Kind: v1alpha1.ScrubKind(in.Kind), Scheduled: in.Scheduled,
		Percent:    int32(math.Min(100, math.Max(0, math.Floor(in.Percent)))),
		DoneBytes:  in.Done,
		TotalBytes: in.Total,
		Mismatches: in.Mismatches, Repaired: in.Repaired, Lost: in.Lost,
		StartTime: t(in.Started),
		Message:   in.Error,
	}
	if in.State == pool.ScrubRunning {
		st.BytesPerSecond = int64(in.Rate)
		if in.ETA > 0 {
			eta := int64(math.Ceil(in.ETA.Seconds()))
			st.ETASeconds = &eta
		}
	}
	if in.Finished != nil {
		st.FinishTime = t(*in.Finished)
	}
	if prev != nil {
		st.Request = prev.Request
		st.LastCompletedTime = prev.LastCompletedTime.DeepCopy()
	}
	if in.LastCompleted != nil {
		st.LastCompletedTime = t(*in.LastCompleted)
	}
	return st
}
