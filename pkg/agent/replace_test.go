package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// replacePool is a Pool whose disks are given and whose ReplaceDisk records its calls. The
// end-to-end test with the real pool is TestClusterMode in cmd/kubectl-raid10.
type replacePool struct {
	Pool
	status pool.Status
	calls  []string
}

func (p *replacePool) Status() pool.Status { return p.status }

func (p *replacePool) ReplaceDisk(ref string, with pool.DiskConfig) (pool.DiskInfo, error) {
	p.calls = append(p.calls, ref+"->"+with.Path)
	return pool.DiskInfo{UUID: "u9", Path: with.Path, Status: pool.StatusActive}, nil
}

// TestReplaceDiskOncePerGeneration covers the agent's side of spec.diskReplacement that the
// real pool cannot easily show: a generation already answered is not carried out again, a
// request found done (crash before the status write) is Succeeded without a second
// pool.ReplaceDisk, the Raid10Node id of a disk is resolved to its UUID, and an unknown disk
// is refused without a call.
func TestReplaceDiskOncePerGeneration(t *testing.T) {
	disks := []pool.DiskInfo{
		{UUID: "u0", Path: "/dev/a", Identity: "WWN-A", Status: pool.StatusActive},
		{UUID: "u1", Path: "/dev/b", Identity: "WWN-B", Status: pool.StatusFailed},
	}
	done := []pool.DiskInfo{
		disks[0],
		{UUID: "u1", Path: "/dev/b", Identity: "WWN-B", Status: pool.StatusRemoved},
		{UUID: "u9", Path: "/dev/c", Identity: "WWN-C", Status: pool.StatusActive},
	}
	req := &v1alpha1.DiskReplacementRequest{OldDisk: "WWN-B", NewPath: "/dev/c"}
	for _, tc := range []struct {
		name      string
		disks     []pool.DiskInfo
		req       *v1alpha1.DiskReplacementRequest
		answered  int64 // status.lastDiskReplacement.observedGeneration; 0: none
		wantCalls []string
		want      v1alpha1.DiskReplacementResult
		wantMsg   string
	}{
		{"NoRequest", disks, nil, 0, nil, "", ""},
		{"ByIdentity", disks, req, 0, []string{"u1->/dev/c"}, v1alpha1.DiskReplacementSucceeded, "replaced by /dev/c"},
		{"ByPath", disks, &v1alpha1.DiskReplacementRequest{OldDisk: "/dev/b", NewPath: "/dev/c"}, 1, []string{"u1->/dev/c"}, v1alpha1.DiskReplacementSucceeded, ""},
		{"AlreadyAnswered", disks, req, 2, nil, v1alpha1.DiskReplacementFailed, "earlier answer"},
		{"FoundDone", done, req, 0, nil, v1alpha1.DiskReplacementSucceeded, "replaced by /dev/c"},
		{"UnknownDisk", disks, &v1alpha1.DiskReplacementRequest{OldDisk: "WWN-X", NewPath: "/dev/c"}, 0, nil, v1alpha1.DiskReplacementFailed, `disk "WWN-X" is not in the pool`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &replacePool{status: pool.Status{Disks: tc.disks}}
			a := &Agent{node: "n1", pool: p} // nil channels: enqueues fall through
			n := &v1alpha1.Raid10Node{}
			n.Name, n.Generation = "n1", 2
			n.Spec.DiskReplacement = tc.req
			if tc.answered > 0 {
				n.Status.LastDiskReplacement = &v1alpha1.DiskReplacementStatus{ObservedGeneration: tc.answered, Result: v1alpha1.DiskReplacementFailed, Message: "earlier answer"}
			}
			got := a.replaceDisk(context.Background(), n)
			if strings.Join(p.calls, ",") != strings.Join(tc.wantCalls, ",") {
				t.Fatalf("pool.ReplaceDisk calls %v, want %v", p.calls, tc.wantCalls)
			}
			if tc.want == "" {
				if got != nil {
					t.Fatalf("status for no request: %+v", got)
				}
				return
			}
			if got == nil || got.Result != tc.want || !strings.Contains(got.Message, tc.wantMsg) {
				t.Fatalf("lastDiskReplacement %+v, want %s with %q", got, tc.want, tc.wantMsg)
			}
			if tc.answered == 0 && got.ObservedGeneration != 2 {
				t.Fatalf("observedGeneration %d, want 2", got.ObservedGeneration)
			}
		})
	}
}

// TestReplaceDiskListsEveryVolume: the status names every volume with a member on the new
// disk, also one whose rebuild was over before the agent read the pool (a small volume),
// and the message counts them all. It used to list and count only those still rebuilding.
func TestReplaceDiskListsEveryVolume(t *testing.T) {
	member := func(disk, state string) pool.MemberInfo { return pool.MemberInfo{DiskUUID: disk, State: state} }
	p := &replacePool{status: pool.Status{
		Disks: []pool.DiskInfo{
			{UUID: "u0", Path: "/dev/a", Status: pool.StatusActive},
			{UUID: "u1", Path: "/dev/b", Status: pool.StatusFailed},
			{UUID: "u9", Path: "/dev/c", Status: pool.StatusActive}, // as ReplaceDisk left it
		},
		Volumes: []pool.VolumeInfo{
			{Name: "small", Members: []pool.MemberInfo{member("u0", "in-sync"), member("u9", "in-sync")}},
			{Name: "large", Members: []pool.MemberInfo{member("u0", "in-sync"), member("u9", "recovering")}},
			{Name: "elsewhere", Members: []pool.MemberInfo{member("u0", "in-sync"), member("u0", "in-sync")}},
		},
	}}
	a := &Agent{node: "n1", pool: p}
	n := &v1alpha1.Raid10Node{}
	n.Name, n.Generation = "n1", 1
	n.Spec.DiskReplacement = &v1alpha1.DiskReplacementRequest{OldDisk: "/dev/b", NewPath: "/dev/c"}
	got := a.replaceDisk(context.Background(), n)
	if got == nil || got.Result != v1alpha1.DiskReplacementSucceeded {
		t.Fatalf("lastDiskReplacement %+v", got)
	}
	if strings.Join(got.RebuildingVolumes, ",") != "small,large" {
		t.Fatalf("rebuildingVolumes %v, want [small large]", got.RebuildingVolumes)
	}
	if !strings.HasSuffix(got.Message, "; 2 volumes rebuild onto it (1 already in sync)") {
		t.Fatalf("message %q", got.Message)
	}
	for _, tc := range []struct {
		n, done int
		want    string
	}{
		{0, 0, "0 volumes rebuild onto it"},
		{1, 0, "1 volume rebuilds onto it"},
		{1, 1, "1 volume rebuilds onto it (1 already in sync)"},
		{3, 0, "3 volumes rebuild onto it"},
	} {
		if got := rebuildMessage(tc.n, tc.done); got != tc.want {
			t.Errorf("rebuildMessage(%d, %d) = %q, want %q", tc.n, tc.done, got, tc.want)
		}
	}
}
