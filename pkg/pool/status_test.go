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
		name      string
		state     raid10.ArrayState
		mem       []raid10.MemberStatus
		bad, lost int64
		want      Health
	}{
		{"all in sync", raid10.ArrayOptimal, m(in, in, in, in), 0, 0, Healthy},
		{"one faulty", raid10.ArrayDegraded, m(in, bad, in, in), 0, 0, Degraded},
		{"one missing", raid10.ArrayDegraded, m(in, in, miss, in), 0, 0, Degraded},
		{"one recovering", raid10.ArrayDegraded, m(in, rec, in, in), 0, 0, Rebuilding},
		{"recovery ended between the reads", raid10.ArrayDegraded, m(in, in, in, in), 0, 0, Healthy},
		{"failed", raid10.ArrayFailed, m(bad, bad, in, in), 0, 0, Failed},
		{"closed", raid10.ArrayClosed, m(in, in), 0, 0, Failed},
		{"bad blocks, every member in sync", raid10.ArrayOptimal, m(in, in, in, in), 3, 0, Degraded},
		{"lost blocks, every member in sync", raid10.ArrayDegraded, m(in, in), 2, 1, Degraded},
		{"lost blocks counted without bad ones", raid10.ArrayOptimal, m(in, in), 0, 1, Degraded},
		{"bad blocks while rebuilding", raid10.ArrayDegraded, m(in, rec, in, in), 1, 0, Rebuilding},
		{"bad blocks and a member down", raid10.ArrayDegraded, m(in, bad, in, in), 1, 1, Degraded},
		{"bad blocks on a failed array", raid10.ArrayFailed, m(bad, bad), 1, 1, Failed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, _ := healthOf(raid10.Status{State: c.state, Members: c.mem, BadBlocks: c.bad, LostBlocks: c.lost}); got != c.want {
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

// TestVolumeInfoBlocks: the engine's bad-block and timeout counts reach VolumeInfo and
// MemberInfo, and a volume with bad blocks is not Healthy.
func TestVolumeInfoBlocks(t *testing.T) {
	p := &Pool{}
	v := &volume{name: "v", size: 1 << 30, members: 2, roles: make([]*role, 2), disks: []UUID{NewUUID(), NewUUID()}}
	st := &raid10.Status{State: raid10.ArrayOptimal, BadBlocks: 5, LostBlocks: 2, Members: []raid10.MemberStatus{
		{Slot: 0, State: raid10.MemberInSync, BadBlocks: 3, TimedOut: 1},
		{Slot: 1, State: raid10.MemberInSync, BadBlocks: 2, TimedOut: 4},
	}}
	vi := p.volumeInfoOf(v, st)
	if vi.Health != Degraded || vi.BadBlocks != 5 || vi.LostBlocks != 2 || vi.TimedOut != 5 || vi.InSync != 2 {
		t.Fatalf("volume info %+v", vi)
	}
	for i, want := range []MemberInfo{{BadBlocks: 3, TimedOut: 1}, {BadBlocks: 2, TimedOut: 4}} {
		if m := vi.Members[i]; m.BadBlocks != want.BadBlocks || m.TimedOut != want.TimedOut || m.State != "in-sync" {
			t.Errorf("member %d: %+v", i, m)
		}
	}
	if vi := p.volumeInfoOf(v, nil); vi.Health != Failed || vi.BadBlocks != 0 {
		t.Fatalf("not assembled: %+v", vi)
	}
}
