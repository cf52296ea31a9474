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
