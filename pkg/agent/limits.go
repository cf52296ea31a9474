package agent

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
)

// applyLimits puts vol's spec.limits on the pool when they differ from what this agent last
// put there for it. The pool keeps limits in memory only, so after a start (nothing recorded
// yet) they are put again even when status.limits already shows them; a volume whose array
// is not assembled gets them from the pool when it is. It returns what status.limits
// reports, the spec's limits once set, and the reconcile's result r; when the pool refuses
// them, prev (the last ones reported) and r with a retry after expandRetry.
func (a *Agent) applyLimits(ctx context.Context, vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeLimits, r reconcile.Result) (*v1alpha1.VolumeLimits, reconcile.Result) {
	want := crstatus.EngineLimits(vol.Spec.Limits)
	a.mu.Lock()
	last, known := a.limits[vol.Name]
	a.mu.Unlock()
	if known && last == want {
		return vol.Spec.Limits.DeepCopy(), r
	}
	logger := klog.FromContext(ctx).WithValues("volumeID", vol.Name, "nodeID", a.node)
	if err := a.pool.SetVolumeLimits(vol.Name, want); err != nil {
		logger.Error(err, "Setting the volume's QoS limits")
		a.event(vol, corev1.EventTypeWarning, EventLimitsFailed, "Limit", "%v", err)
		r.RequeueAfter = expandRetry
		return prev.DeepCopy(), r
	}
	a.mu.Lock()
	a.limits[vol.Name] = want
	a.mu.Unlock()
	if !equality.Semantic.DeepEqual(prev, vol.Spec.Limits) { // news, not a restart's reapply
		logger.Info("Volume QoS limits set", "limits", want)
		a.event(vol, corev1.EventTypeNormal, EventLimitsSet, "Limit", "%s", describeLimits(vol.Spec.Limits))
	}
	return vol.Spec.Limits.DeepCopy(), r
}

// describeLimits says which limits are in force, for the Event.
func describeLimits(l *v1alpha1.VolumeLimits) string {
	if l == nil {
		return "no QoS limits"
	}
	return fmt.Sprintf("QoS limits: read %s, write %s", rateText(l.ReadIOPS, l.ReadBytesPerSecond), rateText(l.WriteIOPS, l.WriteBytesPerSecond))
}

// rateText is "1000 IOPS, 104857600 B/s", with "unlimited" for a 0 part.
func rateText(iops, bps int64) string {
	t := func(n int64, unit string) string {
		if n == 0 {
			return "unlimited " + unit
		}
		return strconv.FormatInt(n, 10) + " " + unit
	}
	return t(iops, "IOPS") + ", " + t(bps, "B/s")
}
