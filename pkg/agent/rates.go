package agent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// applyRates does for spec.rates what applyLimits does for spec.limits: it puts them on the
// pool (pool.SetVolumeRates) when they differ from what this agent last put there for the
// volume, so once after every start (the pool keeps them in memory only), and a volume not
// assembled gets them from the pool when it is. It returns what status.rates reports, the
// spec's rates once set, and the reconcile's result r; when the pool refuses them, prev and r
// with a retry after expandRetry.
func (a *Agent) applyRates(ctx context.Context, vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeRates, r reconcile.Result) (*v1alpha1.VolumeRates, reconcile.Result) {
	ok := applySetting(ctx, a, vol, poolSetting[raid10.Rates]{
		what: "rebuild and scrub rates", reason: "Rates", logKey: "rates", setEvent: EventRatesSet, failEvent: EventRatesFailed,
		want: crstatus.EngineRates(vol.Spec.Rates), last: a.rates, set: a.pool.SetVolumeRates,
		news: !equality.Semantic.DeepEqual(prev, vol.Spec.Rates), describe: func() string { return describeRates(vol.Spec.Rates) },
	})
	if !ok {
		r.RequeueAfter = expandRetry
		return prev.DeepCopy(), r
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
