package crstatus

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func members(states ...string) []pool.MemberInfo {
	var out []pool.MemberInfo
	for i, s := range states {
		out = append(out, pool.MemberInfo{Role: i, DiskUUID: "u" + string(rune('0'+i)), State: s})
	}
	return out
}

// TestVolumeStatus: the translation of pool.VolumeInfo into the Raid10Volume status.
func TestVolumeStatus(t *testing.T) {
	now := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	ids := map[string]string{"u0": "d0", "u1": "d1", "u2": "d2", "u3": "d3"}
	vol := &v1alpha1.Raid10Volume{}
	vol.Generation = 3
	started := metav1.NewTime(now.Add(-time.Minute))
	for _, tc := range []struct {
		name       string
		prev       v1alpha1.Raid10VolumeStatus
		info       pool.VolumeInfo
		phase      v1alpha1.VolumePhase
		inSync     string
		ready      metav1.ConditionStatus
		rebuild    int32 // percent, -1 for none
		startTime  *metav1.Time
		memberWant []v1alpha1.MemberState
		redundant  string // the Redundant condition: "True" or the False reason, then its message
	}{
		{
			name:  "Healthy",
			info:  pool.VolumeInfo{Size: 1 << 30, Health: pool.Healthy, InSync: 4, Members: members("in-sync", "in-sync", "in-sync", "in-sync")},
			phase: v1alpha1.VolumePhaseReady, inSync: "4/4", ready: metav1.ConditionTrue, rebuild: -1,
			memberWant: []v1alpha1.MemberState{"InSync", "InSync", "InSync", "InSync"},
			redundant:  "True: every chunk has both its copies, 4/4 members in sync",
		},
		{
			name:  "BadBlocks",
			info:  pool.VolumeInfo{Size: 1 << 30, Health: pool.Degraded, InSync: 4, BadBlocks: 3, Members: members("in-sync", "in-sync", "in-sync", "in-sync")},
			phase: v1alpha1.VolumePhaseReady, inSync: "4/4", ready: metav1.ConditionTrue, rebuild: -1,
			memberWant: []v1alpha1.MemberState{"InSync", "InSync", "InSync", "InSync"},
			redundant:  "BadBlocks: redundancy reduced: 4/4 members in sync, 3 bad blocks (each still read from its other copy)",
		},
		{
			name:  "Degraded",
			info:  pool.VolumeInfo{Size: 1 << 30, Health: pool.Degraded, InSync: 3, Members: members("in-sync", "faulty", "in-sync", "missing")},
			phase: v1alpha1.VolumePhaseReady, inSync: "3/4", ready: metav1.ConditionTrue, rebuild: -1,
			memberWant: []v1alpha1.MemberState{"InSync", "Failed", "InSync", "Missing"},
			redundant:  "Degraded: redundancy reduced: 3/4 members in sync",
		},
		{
			name: "RebuildStarts",
			info: pool.VolumeInfo{Size: 1 << 30, Health: pool.Rebuilding, InSync: 3, Members: members("in-sync", "recovering", "in-sync", "in-sync"),
				Sync: &pool.Progress{Kind: "recovery", Done: 1 << 20, Total: 4 << 20, Percent: 25.7, Rate: 1 << 20, ETA: 2500 * time.Millisecond}},
			phase: v1alpha1.VolumePhaseReady, inSync: "3/4", ready: metav1.ConditionTrue, rebuild: 25, startTime: ptrTime(metav1.NewTime(now)),
			memberWant: []v1alpha1.MemberState{"InSync", "Rebuilding", "InSync", "InSync"},
			redundant:  "Rebuilding: redundancy reduced until the rebuild ends: 3/4 members in sync, member 1 25% rebuilt, ETA 3s",
		},
		{
			name: "RebuildKeepsStart",
			prev: v1alpha1.Raid10VolumeStatus{Rebuild: &v1alpha1.RebuildProgress{Member: 1, StartTime: &started}},
			info: pool.VolumeInfo{Size: 1 << 30, Health: pool.Rebuilding, InSync: 3, Members: members("in-sync", "recovering", "in-sync", "in-sync"),
				Sync: &pool.Progress{Kind: "recovery", Done: 3 << 20, Total: 4 << 20, Percent: 75}},
			phase: v1alpha1.VolumePhaseReady, inSync: "3/4", ready: metav1.ConditionTrue, rebuild: 75, startTime: &started,
			memberWant: []v1alpha1.MemberState{"InSync", "Rebuilding", "InSync", "InSync"},
			redundant:  "Rebuilding: redundancy reduced until the rebuild ends: 3/4 members in sync, member 1 75% rebuilt",
		},
		{
			name:  "Failed",
			info:  pool.VolumeInfo{Size: 1 << 30, Health: pool.Failed, Members: members("missing", "missing"), Reason: "not assembled"},
			phase: v1alpha1.VolumePhaseFailed, inSync: "0/2", ready: metav1.ConditionFalse, rebuild: -1,
			memberWant: []v1alpha1.MemberState{"Missing", "Missing"},
			redundant:  "Failed: data lost: some chunk has no copy left: not assembled",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := VolumeStatus(tc.prev, vol, tc.info, ids, now)
			if st.Phase != tc.phase || st.InSync != tc.inSync || st.ObservedGeneration != 3 || string(st.Health) != string(tc.info.Health) {
				t.Fatalf("status %+v", st)
			}
			if st.Capacity.Value() != int64(tc.info.Size) {
				t.Fatalf("capacity %v", st.Capacity)
			}
			cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
			if cond == nil || cond.Status != tc.ready || cond.ObservedGeneration != 3 {
				t.Fatalf("Ready condition %+v", cond)
			}
			red := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRedundant)
			got := "missing"
			if red != nil {
				got = red.Reason + ": " + red.Message
				if red.Status == metav1.ConditionTrue {
					got = "True: " + red.Message
				}
			}
			if got != tc.redundant {
				t.Errorf("Redundant condition %q, want %q", got, tc.redundant)
			}
			for i, m := range st.Members {
				if m.State != tc.memberWant[i] || m.Index != int32(i) || m.Disk != ids[tc.info.Members[i].DiskUUID] {
					t.Fatalf("member %d: %+v, want state %s", i, m, tc.memberWant[i])
				}
			}
			switch {
			case tc.rebuild < 0 && st.Rebuild != nil:
				t.Fatalf("rebuild %+v, want none", st.Rebuild)
			case tc.rebuild >= 0:
				r := st.Rebuild
				if r == nil || r.Percent != tc.rebuild || r.Member != 1 || r.DoneBytes != tc.info.Sync.Done || r.TotalBytes != tc.info.Sync.Total {
					t.Fatalf("rebuild %+v, want %d%% of member 1", r, tc.rebuild)
				}
				if !r.StartTime.Equal(tc.startTime) {
					t.Fatalf("rebuild start %v, want %v", r.StartTime, tc.startTime)
				}
				if tc.info.Sync.ETA > 0 && (r.ETASeconds == nil || *r.ETASeconds != 3) {
					t.Fatalf("ETA %v, want 3 s", r.ETASeconds)
				}
			}
		})
	}
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

// TestNodeStatus: disks, counts, capacity and conditions of the Raid10Node.
func TestNodeStatus(t *testing.T) {
	now := time.Now()
	ps := pool.Status{
		Name: "default", UUID: "p",
		Capacity: pool.Capacity{Raw: 400 << 20, Usable: 200 << 20, LargestVolume: 150 << 20},
		Disks: []pool.DiskInfo{
			{UUID: "u0", Path: "/d0", Status: pool.StatusActive, Size: 100 << 20},
			{UUID: "u1", Path: "/d1", Status: pool.StatusActive, Size: 100 << 20, Identity: "WWN-1"},
			{UUID: "u2", Path: "/d2", Status: pool.StatusFailed, Size: 100 << 20, Identity: "WWN-1"}, // shared identity
			{UUID: "u3", Path: "/d3", Status: pool.StatusSpare, Size: 100 << 20},
			{UUID: "u4", Path: "/d4", Status: pool.StatusRemoved, Size: 100 << 20},
			{Path: "/d5", Status: pool.StatusRefused, Reason: "ext4 signature"},
			{UUID: "u6", Status: pool.StatusMissing},
		},
	}
	st := NodeStatus(v1alpha1.Raid10NodeStatus{}, ps, map[string]uint64{"u0": 90 << 20, "u1": 80 << 20}, now)
	wantIDs := []string{"u0", "WWN-1", "u2", "u3", "/d5", "u6"}
	wantStates := []v1alpha1.DiskState{"Healthy", "Healthy", "Failed", "Healthy", "Failed", "Missing"}
	wantFree := []int64{90 << 20, 80 << 20, 0, 0, 0, 0}
	if len(st.Disks) != len(wantIDs) {
		t.Fatalf("disks: %+v", st.Disks)
	}
	for i, d := range st.Disks {
		if d.ID != wantIDs[i] || d.State != wantStates[i] || d.FreeBytes != wantFree[i] {
			t.Fatalf("disk %d: %+v, want id %s state %s free %d", i, d, wantIDs[i], wantStates[i], wantFree[i])
		}
	}
	if st.DiskCount != 6 || st.HealthyDisks != 3 {
		t.Fatalf("counts %d/%d", st.HealthyDisks, st.DiskCount)
	}
	if st.Capacity.Raw.Value() != 400<<20 || st.Capacity.Usable.Value() != 200<<20 || st.Capacity.Free.Value() != 150<<20 {
		t.Fatalf("capacity %+v", st.Capacity)
	}
	if c := meta.FindStatusCondition(st.Conditions, ConditionDisksHealthy); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("DisksHealthy %+v", c)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v", c)
	}
}

// TestCreateFailedReason: the pool's refusals are final with their reasons; anything else
// (I/O, a closed pool) is retried.
func TestCreateFailedReason(t *testing.T) {
	for _, tc := range []struct {
		err    error
		reason string
		final  bool
	}{
		{fmt.Errorf("x: %w", pool.ErrNoSpace), v1alpha1.ReasonInsufficientCapacity, true},
		{fmt.Errorf("x: %w", pool.ErrInvalidArgument), ReasonCreateFailed, true},
		{fmt.Errorf("x: %w", pool.ErrAlreadyExists), ReasonCreateFailed, true},
		{pool.ErrClosed, ReasonCreateFailed, false},
	} {
		if r, f := CreateFailedReason(tc.err); r != tc.reason || f != tc.final {
			t.Errorf("CreateFailedReason(%v) = %s, %v; want %s, %v", tc.err, r, f, tc.reason, tc.final)
		}
	}
	st := ExpandPending(v1alpha1.Raid10VolumeStatus{Phase: v1alpha1.VolumePhaseReady, Message: "resync 10%"}, "expansion pending")
	if st.Phase != v1alpha1.VolumePhaseExpanding || st.Message != "expansion pending; resync 10%" {
		t.Errorf("ExpandPending: %s %q", st.Phase, st.Message)
	}
}

// TestVolumeStatusBlocks: bad and lost blocks in the volume's status, per member, in the
// message and in the Ready condition.
func TestVolumeStatusBlocks(t *testing.T) {
	now := time.Now()
	vol := &v1alpha1.Raid10Volume{}
	mem := func(bad ...int64) []pool.MemberInfo {
		m := members("in-sync", "in-sync")
		for i := range m {
			m[i].BadBlocks, m[i].TimedOut, m[i].SlowLastCopy = bad[i], uint64(i), uint64(2*i)
		}
		return m
	}
	for _, tc := range []struct {
		name      string
		info      pool.VolumeInfo
		msg, cond string // wanted in status.message and the Ready condition's message
	}{
		{"none", pool.VolumeInfo{Health: pool.Healthy, InSync: 2, Members: mem(0, 0)}, "", "Healthy, 2/2 members in sync"},
		{"bad", pool.VolumeInfo{Health: pool.Degraded, InSync: 2, BadBlocks: 4, Members: mem(3, 1)},
			"4 bad blocks (each still read from its other copy)", "Degraded, 2/2 members in sync, 4 bad blocks"},
		{"lost", pool.VolumeInfo{Health: pool.Degraded, InSync: 2, BadBlocks: 4, LostBlocks: 1, Members: mem(2, 2)},
			"4 bad blocks, 1 of them lost (bad on every copy: reads there fail until rewritten)", "Degraded, 2/2 members in sync, 4 bad blocks, 1 of them lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := VolumeStatus(v1alpha1.Raid10VolumeStatus{}, vol, tc.info, nil, now)
			if st.BadBlocks != tc.info.BadBlocks || st.LostBlocks != tc.info.LostBlocks || st.Message != tc.msg {
				t.Fatalf("badBlocks %d lostBlocks %d message %q", st.BadBlocks, st.LostBlocks, st.Message)
			}
			for i, m := range st.Members {
				if m.BadBlocks != tc.info.Members[i].BadBlocks || m.Timeouts != int64(i) || m.SlowStalls != int64(2*i) {
					t.Errorf("member %d: %+v", i, m)
				}
				if (m.BadBlocks > 0) != strings.Contains(m.Message, "recorded bad") {
					t.Errorf("member %d message %q", i, m.Message)
				}
			}
			if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); c == nil || !strings.HasPrefix(c.Message, tc.cond) || c.Status != metav1.ConditionTrue {
				t.Fatalf("Ready %+v, want %q", c, tc.cond)
			}
		})
	}
}

// TestSnapshotStatus: the translation of a pool snapshot into the Raid10Snapshot status.
func TestSnapshotStatus(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	cut := now.Add(-time.Minute)
	snap := &v1alpha1.Raid10Snapshot{}
	snap.Generation = 1
	copying := SnapshotStatus(v1alpha1.Raid10SnapshotStatus{}, snap, pool.SnapshotInfo{Size: 1000, Copied: 999, CutAt: cut, Health: pool.Healthy, Members: 4}, now)
	if copying.Phase != v1alpha1.SnapshotPhaseCopying || copying.ReadyToUse || copying.Percent != 99 || !copying.CutAt.Time.Equal(cut) ||
		copying.Conditions[0].Reason != ReasonCopying || copying.Conditions[0].Status != "False" || copying.Size.Value() != 1000 {
		t.Errorf("copying: %+v", copying)
	}
	ready := SnapshotStatus(copying, snap, pool.SnapshotInfo{Size: 1000, Copied: 1000, Ready: true, CutAt: cut, Health: pool.Healthy}, now.Add(time.Second))
	if ready.Phase != v1alpha1.SnapshotPhaseReady || !ready.ReadyToUse || ready.Percent != 100 || ready.CopiedBytes != 1000 ||
		ready.Conditions[0].Reason != ReasonCopied || !ready.Conditions[0].LastTransitionTime.Time.Equal(now.Add(time.Second)) {
		t.Errorf("ready: %+v", ready)
	}
	lost := SnapshotStatus(ready, snap, pool.SnapshotInfo{Size: 1000, Ready: true, CutAt: cut, Health: pool.Failed}, now)
	if lost.Phase != v1alpha1.SnapshotPhaseFailed || lost.Conditions[0].Reason != ReasonArrayFailed {
		t.Errorf("lost: %+v", lost)
	}
	failed := SnapshotFailedStatus(ready, snap, ReasonNotInPool, "gone", now)
	if failed.Phase != v1alpha1.SnapshotPhaseFailed || failed.ReadyToUse || failed.CutAt == nil || failed.Message != "gone" {
		t.Errorf("failed keeps the cut, not ready: %+v", failed)
	}
	for _, tc := range []struct {
		err    error
		reason string
		final  bool
	}{
		{fmt.Errorf("x: %w", pool.ErrNoSpace), v1alpha1.ReasonInsufficientCapacity, true},
		{fmt.Errorf("x: %w", pool.ErrNotFound), v1alpha1.ReasonSourceNotFound, true},
		{fmt.Errorf("x: %w", pool.ErrAlreadyExists), ReasonCreateFailed, true},
		{pool.ErrClosed, ReasonCreateFailed, false},
	} {
		if r, f := CreateFailedReason(tc.err); r != tc.reason || f != tc.final {
			t.Errorf("CreateFailedReason(%v) = %s, %v; want %s, %v", tc.err, r, f, tc.reason, tc.final)
		}
	}
}
