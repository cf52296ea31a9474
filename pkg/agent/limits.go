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
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// applyLimits puts vol's spec.limits on the pool when they differ from what this agent last
// put there for it. The pool keeps limits in memory only, so after a start (nothing recorded
// yet) they are put again even when status.limits already shows them; a volume whose array
// is not assembled gets them from the pool when it is. It returns what status.limits
// reports, the spec's limits once set, and the reconcile's result r; when the pool refuses
// them, prev (the last ones reported) and r with a retry after expandRetry.
func (a *Agent) applyLimits(ctx context.Context, vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeLimits, r reconcile.Result) (*v1alpha1.VolumeLimits, reconcile.Result) {
	ok := applySetting(ctx, a, vol, poolSetting[raid10.Limits]{
		what: "QoS limits", reason: "Limit", logKey: "limits", setEvent: EventLimitsSet, failEvent: EventLimitsFailed,
		want: crstatus.EngineLimits(vol.Spec.Limits), last: a.limits, set: a.pool.SetVolumeLimits,
		news: !equality.Semantic.DeepEqual(prev, vol.Spec.Limits), describe: func() string { return describeLimits(vol.Spec.Limits) },
	})
	if !ok {
		r.RequeueAfter = expandRetry
		return prev.DeepCopy(), r
	}
	return vol.Spec.Limits.DeepCopy(), r
}

// poolSetting is one per-volume setting the agent puts on the pool (limits, rates): the
// value the spec wants, what this agent last put there by volume, and the pool's setter.
type poolSetting[E comparable] struct {
	what, reason        string // for the log ("QoS limits") and the Events' reason suffix
	logKey              string // the log line's key for the value
	setEvent, failEvent string
	want                E
	last                map[string]E // guarded by Agent.mu
	set                 func(volume string, e E) error
	news                bool // the spec changed (not a restart's reapply): log it and record an Event
	describe            func() string
}

// applySetting puts s.want on the pool unless it is what this agent last put there for vol,
// and reports whether the volume has it now; a refusal is logged and recorded as an Event.
func applySetting[E comparable](ctx context.Context, a *Agent, vol *v1alpha1.Raid10Volume, s poolSetting[E]) bool {
	a.mu.Lock()
	last, known := s.last[vol.Name]
	a.mu.Unlock()
	if known && last == s.want {
		return true
	}
	logger := klog.FromContext(ctx).WithValues("volumeID", vol.Name, "nodeID", a.node)
	if err := s.set(vol.Name, s.want); err != nil {
		logger.Error(err, "Setting the volume's "+s.what)
		a.event(vol, corev1.EventTypeWarning, s.failEvent, s.reason, "%v", err)
		return false
	}
	a.mu.Lock()
	s.last[vol.Name] = s.want
	a.mu.Unlock()
	if s.news {
		logger.Info("Volume "+s.what+" set", s.logKey, s.want)
		a.event(vol, corev1.EventTypeNormal, s.setEvent, s.reason, "%s", s.describe())
	}
	return true
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
