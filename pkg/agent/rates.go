package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
)

// applyRates does for spec.rates what applyLimits does for spec.limits: it puts them on the
// pool (pool.SetVolumeRates) when they differ from what this agent last put there for the
// volume, so once after every start (the pool keeps them in memory only), and a volume not
// assembled gets them from the pool when it is. It returns what status.rates reports, the
// spec's rates once set, and the reconcile's result r; when the pool refuses them, prev and r
// with a retry after expandRetry.
func (a *Agent) applyRates(ctx context.Context, vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeRates, r reconcile.Result) (*v1alpha1.VolumeRates, reconcile.Result) {
	want := crstatus.EngineRates(vol.Spec.Rates)
	a.mu.Lock()
	last, known := a.rates[vol.Name]
	a.mu.Unlock()
	if known && last == want {
		return vol.Spec.Rates.DeepCopy(), r
	}
	logger := klog.FromContext(ctx).WithValues("volumeID", vol.Name, "nodeID", a.node)
	if err := a.pool.SetVolumeRates(vol.Name, want); err != nil {
		logger.Error(err, "Setting the volume's rebuild and scrub rates")
		a.event(vol, corev1.EventTypeWarning, EventRatesFailed, "Rates", "%v", err)
		r.RequeueAfter = expandRetry
		return prev.DeepCopy(), r
	}
	a.mu.Lock()
	a.rates[vol.Name] = want
	a.mu.Unlock()
	if !equality.Semantic.DeepEqual(prev, vol.Spec.Rates) { // news, not a restart's reapply
		logger.Info("Volume rates set", "rates", want)
		a.event(vol, corev1.EventTypeNormal, EventRatesSet, "Rates", "%s", describeRates(vol.Spec.Rates))
	}
	return vol.Spec.Rates.DeepCopy(), r
}

// describeRates says which rates are in force, for the Event.
func describeRates(r *v1alpha1.VolumeRates) string {
	if r == nil {
		return "the node's rebuild and scrub rates"
	}
	t := func(n int64) string {
		if n == 0 {
			return "the node's"
		}
		return fmt.Sprintf("%d B/s", n)
	}
	return fmt.Sprintf("rates: rebuild min %s, rebuild max %s, scrub max %s", t(r.RebuildRateMin), t(r.RebuildRateMax), t(r.ScrubRateMax))
}
