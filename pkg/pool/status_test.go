package pool

import (
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

func TestHealthOf(t *testing.T) {
	m := func(states ...raid10.MemberState) []raid10.MemberStatus {
		var out []raid10.MemberStatus
		for i, s := range states {
			out = append(out, raid10.MemberStatus{Slot: i, State: s})
		}
		return out
	}
	in, rec, bad, miss := raid10.MemberInSync, raid10.MemberRecovering, raid10.MemberFaulty, raid10.MemberMissing
	cases := []struct {
		name  string
		state raid10.ArrayState
		mem   []raid10.MemberStatus
		want  Health
	}{
		{"all in sync", raid10.ArrayOptimal, m(in, in, in, in), Healthy},
		{"one faulty", raid10.ArrayDegraded, m(in, bad, in, in), Degraded},
		{"one missing", raid10.ArrayDegraded, m(in, in, miss, in), Degraded},
		{"one recovering", raid10.ArrayDegraded, m(in, rec, in, in), Rebuilding},
		{"recovery ended between the reads", raid10.ArrayDegraded, m(in, in, in, in), Healthy},
		{"failed", raid10.ArrayFailed, m(bad, bad, in, in), Failed},
		{"closed", raid10.ArrayClosed, m(in, in), Failed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, _ := healthOf(raid10.Status{State: c.state, Members: c.mem}); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
	_, p := healthOf(raid10.Status{Members: m(in, rec), State: raid10.ArrayDegraded,
		Sync: raid10.SyncProgress{Kind: raid10.SyncRecovery, Running: true, Done: 25, Total: 100}})
	if p == nil || p.Percent != 25 || p.Kind != "recovery" {
		t.Fatalf("progress: %+v", p)
	}
}
