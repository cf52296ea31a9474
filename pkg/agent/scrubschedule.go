package agent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// applyScrubSchedule does for spec.scrubSchedule what applyRates does for spec.rates: it puts
// the volume's schedule on the pool (pool.SetVolumeScrubSchedule; absent: the node's) when it
// differs from what this agent last put there, so once after every start (the pool keeps it
// in memory only). It returns what status.scrubSchedule reports, the spec's schedule once
// set, and the reconcile's result r; when the pool refuses it, prev and r with a retry after
// expandRetry.
func (a *Agent) applyScrubSchedule(ctx context.Context, vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeScrubSchedule, r reconcile.Result) (*v1alpha1.VolumeScrubSchedule, reconcile.Result) {
	ok := applySetting(ctx, a, vol, poolSetting[pool.ScrubConfig]{
		what: "scrub schedule", reason: "ScrubSchedule", logKey: "scrubSchedule", setEvent: EventScrubScheduleSet, failEvent: EventScrubScheduleFailed,
		want: crstatus.EngineScrubSchedule(vol.Spec.ScrubSchedule), last: a.scrubSchedules,
		set: func(name string, c pool.ScrubConfig) error {
			return crstatus.SetScrubSchedule(a.pool.SetVolumeScrubSchedule, name, c)
		},
		news: !equality.Semantic.DeepEqual(prev, vol.Spec.ScrubSchedule), describe: func() string { return describeScrubSchedule(vol.Spec.ScrubSchedule) },
	})
	if !ok {
		r.RequeueAfter = expandRetry
		return prev.DeepCopy(), r
	}
	return vol.Spec.ScrubSchedule.DeepCopy(), r
}

// describeScrubSchedule says which scrub schedule is in force, for the Event.
func describeScrubSchedule(s *v1alpha1.VolumeScrubSchedule) string {
	if s == nil {
		return "the node's scrub schedule"
	}
	start, window := s.Start, s.Window
	if start == "" {
		start = pool.DefaultScrubStart
	}
	if window == "" {
		window = pool.DefaultScrubWindow.String()
	}
	kind := "check"
	if s.Repair {
		kind = "repair"
	}
	return fmt.Sprintf("scrub schedule of its own: %s %s, nightly from %s for %s", s.Schedule, kind, start, window)
}
