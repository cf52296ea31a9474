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

// Scrub Event reasons.
const (
	EventScrubStarted    = "ScrubStarted"
	EventScrubFinished   = "ScrubFinished"
	EventScrubMismatches = "ScrubMismatches"
	EventScrubFailed     = "ScrubFailed"
)

// requestedScrub starts the scrub spec.scrub asks for when the agent has not acted on that
// request yet, and returns st with status.scrub answering it: the scrub's state, or Failed
// with the reason it could not start (a Degraded volume: rebuild first). Each request is
// acted on once; a new one (kubectl raid10 scrub) asks again.
func (a *Agent) requestedScrub(ctx context.Context, vol *v1alpha1.Raid10Volume, st v1alpha1.Raid10VolumeStatus) v1alpha1.Raid10VolumeStatus {
	rq := vol.Spec.Scrub
	if rq == nil || (st.Scrub != nil && st.Scrub.Request == rq.Request) {
		return st
	}
	kind := pool.ScrubCheck
	if rq.Kind == v1alpha1.ScrubKindRepair {
		kind = pool.ScrubRepair
	}
	in, err := a.pool.StartScrub(vol.Name, kind)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Requested scrub not started", "volumeID", vol.Name, "kind", kind)
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		sc := &v1alpha1.ScrubStatus{State: v1alpha1.ScrubStateFailed, Kind: v1alpha1.ScrubKind(kind),
			StartTime: &now, FinishTime: &now, Message: err.Error()}
		if st.Scrub != nil {
			sc.LastCompletedTime = st.Scrub.LastCompletedTime
		}
		st.Scrub = sc
	} else {
		st.Scrub = crstatus.ScrubStatus(st.Scrub, &in)
		a.event(vol, corev1.EventTypeNormal, EventScrubStarted, "Scrub", "%s of %d bytes (request %s)", kind, in.Total, rq.Request)
	}
	st.Scrub.Request = rq.Request
	return st
}

// scrubEvents records an Event when a scrub ends: ScrubMismatches (Warning) when its
// copies differed, ScrubFinished otherwise, ScrubFailed when it failed. seen is what was
// reported last ("" for nothing).
func (a *Agent) scrubEvents(vol *v1alpha1.Raid10Volume, seen string, sc *v1alpha1.ScrubStatus) {
	if sc == nil || scrubSeen(sc) == seen || sc.State == v1alpha1.ScrubStateRunning || sc.State == v1alpha1.ScrubStatePaused {
		return
	}
	switch {
	case sc.State == v1alpha1.ScrubStateFailed:
		a.event(vol, corev1.EventTypeWarning, EventScrubFailed, "Scrub", "%s: %s", sc.Kind, sc.Message)
	case sc.Mismatches > 0:
		msg := fmt.Sprintf("%s found %d blocks whose copies differ", sc.Kind, sc.Mismatches)
		if sc.Kind == v1alpha1.ScrubKindRepair {
			msg += fmt.Sprintf(", %d rewritten from the first copy", sc.Repaired)
		}
		a.event(vol, corev1.EventTypeWarning, EventScrubMismatches, "Scrub", "%s%s", msg, lostNote(sc.Lost))
	default:
		a.event(vol, corev1.EventTypeNormal, EventScrubFinished, "Scrub", "%s of %d bytes: no mismatches%s", sc.Kind, sc.TotalBytes, lostNote(sc.Lost))
	}
}

func lostNote(lost int64) string {
	if lost == 0 {
		return ""
	}
	return fmt.Sprintf("; %d blocks with no readable copy (lost)", lost)
}

// scrubSeen identifies a scrub's outcome for scrubEvents.
func scrubSeen(sc *v1alpha1.ScrubStatus) string {
	if sc == nil {
		return ""
	}
	fin := ""
	if sc.FinishTime != nil {
		fin = sc.FinishTime.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s|%s|%s|%s", sc.Request, sc.State, sc.StartTime, fin)
}
