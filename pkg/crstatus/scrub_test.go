package crstatus

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestScrubStatus: the translation of the pool's scrub state into status.scrub.
func TestScrubStatus(t *testing.T) {
	now := time.Date(2026, 11, 30, 5, 0, 0, 700, time.UTC)
	done := now.Add(-time.Hour)
	old := metav1.NewTime(now.Add(-30 * 24 * time.Hour))
	prev := &v1alpha1.ScrubStatus{Request: "r1", State: v1alpha1.ScrubStateDone, Kind: v1alpha1.ScrubKindCheck, LastCompletedTime: &old}
	for _, tc := range []struct {
		name  string
		prev  *v1alpha1.ScrubStatus
		in    *pool.ScrubInfo
		check func(t *testing.T, st *v1alpha1.ScrubStatus)
	}{
		{"NoneEver", nil, nil, func(t *testing.T, st *v1alpha1.ScrubStatus) {
			if st != nil {
				t.Fatalf("%+v", st)
			}
		}},
		{"KeptAcrossRestart", prev, nil, func(t *testing.T, st *v1alpha1.ScrubStatus) {
			if st == nil || st.Request != "r1" || !st.LastCompletedTime.Equal(&old) {
				t.Fatalf("%+v", st)
			}
		}},
		{"Running", prev, &pool.ScrubInfo{State: pool.ScrubRunning, Kind: pool.ScrubRepair, Started: now, Done: 1 << 20, Total: 4 << 20,
			Percent: 25.9, Rate: 1 << 20, ETA: 2100 * time.Millisecond, Mismatches: 3, Repaired: 3}, func(t *testing.T, st *v1alpha1.ScrubStatus) {
			if st.State != v1alpha1.ScrubStateRunning || st.Kind != v1alpha1.ScrubKindRepair || st.Percent != 25 || st.BytesPerSecond != 1<<20 ||
				st.ETASeconds == nil || *st.ETASeconds != 3 || st.Mismatches != 3 || st.Repaired != 3 || st.Request != "r1" ||
				!st.LastCompletedTime.Equal(&old) || st.FinishTime != nil || st.StartTime.Nanosecond() != 0 {
				t.Fatalf("%+v", st)
			}
		}},
		{"Done", prev, &pool.ScrubInfo{State: pool.ScrubDone, Kind: pool.ScrubCheck, Started: now.Add(-2 * time.Hour), Finished: &done,
			LastCompleted: &done, Done: 4 << 20, Total: 4 << 20, Percent: 100, Mismatches: 1, Lost: 2}, func(t *testing.T, st *v1alpha1.ScrubStatus) {
			if st.State != v1alpha1.ScrubStateDone || st.Percent != 100 || st.ETASeconds != nil || st.BytesPerSecond != 0 ||
				st.LastCompletedTime == nil || !st.LastCompletedTime.Time.Equal(done.Truncate(time.Second)) || st.Lost != 2 {
				t.Fatalf("%+v", st)
			}
		}},
		{"Failed", nil, &pool.ScrubInfo{State: pool.ScrubFailed, Kind: pool.ScrubCheck, Started: now, Finished: &now, Error: "closed"},
			func(t *testing.T, st *v1alpha1.ScrubStatus) {
				if st.State != v1alpha1.ScrubStateFailed || st.Message != "closed" || st.LastCompletedTime != nil {
					t.Fatalf("%+v", st)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, ScrubStatus(tc.prev, tc.in)) })
	}
}
