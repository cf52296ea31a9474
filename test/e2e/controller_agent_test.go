package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// controllerAgentFlow (run by TestRBACLeastPrivilege/ControllerAgent) drives the real node agent
// through the real CSI controller, called over gRPC on its unix socket, with a real kube-apiserver
// between them: CreateVolume gives a Raid10Volume that the agent builds Healthy; GetCapacity
// follows the pool's free space; a failed disk shows Degraded, its replacement Rebuilding with a
// percentage, then Healthy, each read from the Table that `kubectl get r10v` prints;
// ControllerExpandVolume grows it in place; DeleteVolume frees the extents and the space comes
// back.
//
// It runs on cl. What it starts stops when t ends; the object it leaves is the Raid10Node node-e2e.
func controllerAgentFlow(t *testing.T, cl *cluster) {
	const (
		node     = "node-e2e"
		diskSize = 256 << 20
		volSize  = 64 << 20
		// rebuildRate stretches the rebuild of a 64 MiB volume (32 MiB per member) over
		// about eight seconds, several of the agent's one-second status polls even when a
		// loaded machine stretches each poll (the test needs two Rebuilding percentages).
		rebuildRate = 4 << 20
		volName     = "pvc-e2e-controller-agent"
	)
	pl, paths := filePool(t, 4, 1, diskSize, rebuildRate)
	cl.startAgent(t, node, pl, 4)
	sock := cl.startController(t, 30*time.Second)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctrl := csi.NewControllerClient(conn)
	ctx := t.Context()
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Minute) }

	topo := &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: node}}
	params := map[string]string{"members": "4", "chunkSize": "512Ki"}
	getCapacity := func() (available, largest int64) {
		cctx, cancel := call()
		defer cancel()
		resp, err := ctrl.GetCapacity(cctx, &csi.GetCapacityRequest{Parameters: params, AccessibleTopology: topo})
		if err != nil {
			t.Fatalf("GetCapacity: %v", err)
		}
		return resp.GetAvailableCapacity(), resp.GetMaximumVolumeSize().GetValue()
	}
	// waitCapacity waits until GetCapacity answers what the pool says the largest volume is
	// now (the agent reports within its poll interval), and returns it.
	waitCapacity := func(what string) int64 {
		t.Helper()
		var avail, largest int64
		var want uint64
		d := waitFor(t, time.Minute, "GetCapacity "+what, func() (bool, string) {
			avail, largest = getCapacity()
			want = pl.Capacity().LargestVolume
			return avail == int64(want) && largest == int64(want),
				fmt.Sprintf("available %d, maximum volume size %d; pool's largest volume %d", avail, largest, want)
		})
		t.Logf("GetCapacity %s: %d bytes (%d MiB) free on %s, the pool's largest volume, after %v", what, avail, avail>>20, node, d.Round(time.Millisecond))
		return avail
	}
	freeBefore := waitCapacity("before")

	// CreateVolume: the agent builds the array, the controller answers once it is Ready.
	begin := time.Now()
	cctx, cancel := call()
	resp, err := ctrl.CreateVolume(cctx, &csi.CreateVolumeRequest{
		Name:          volName,
		CapacityRange: &csi.CapacityRange{RequiredBytes: volSize},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Parameters:                params,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topo}, Preferred: []*csi.Topology{topo}},
	})
	cancel()
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	v := resp.GetVolume()
	t.Logf("CreateVolume answered in %v: id %s, %d bytes, topology %v", time.Since(begin).Round(time.Millisecond), v.GetVolumeId(), v.GetCapacityBytes(), v.GetAccessibleTopology())
	if v.GetVolumeId() != volName || v.GetCapacityBytes() < volSize || len(v.GetAccessibleTopology()) != 1 ||
		v.GetAccessibleTopology()[0].GetSegments()[v1alpha1.TopologyNodeKey] != node {
		t.Fatalf("CreateVolume answered %v, want volume %s of at least %d bytes on %s", v, volName, volSize, node)
	}
	if _, err := pl.Volume(volName); err != nil {
		t.Fatalf("the pool has no volume %s after CreateVolume: %v", volName, err)
	}
	row := cl.tableRow(ctx, t, "raid10volumes", volName)
	t.Logf("kubectl get r10v: %v", row)
	if row == nil || row["Node"] != node || row["State"] != string(v1alpha1.VolumePhaseReady) ||
		row["Health"] != string(v1alpha1.VolumeHealthHealthy) || row["Members"] != "4/4" || row["Rebuild"] != nil {
		t.Fatalf("r10v %s after CreateVolume: %v, want Ready, Healthy, 4/4 on %s, no rebuild", volName, row, node)
	}
	freeAfterCreate := waitCapacity("after CreateVolume")
	if freeAfterCreate >= freeBefore {
		t.Fatalf("GetCapacity after CreateVolume %d, before %d: the volume took no space", freeAfterCreate, freeBefore)
	}

	// A failed disk: Degraded, 3/4, still Ready.
	if err := pl.FailDisk(paths[1]); err != nil {
		t.Fatalf("FailDisk %s: %v", paths[1], err)
	}
	d := waitFor(t, time.Minute, "r10v Degraded after FailDisk", func() (bool, string) {
		row = cl.tableRow(ctx, t, "raid10volumes", volName)
		return row["Health"] == string(v1alpha1.VolumeHealthDegraded), fmt.Sprint(row)
	})
	t.Logf("kubectl get r10v %v after FailDisk: %v", d.Round(time.Millisecond), row)
	if row["Members"] != "3/4" || row["State"] != string(v1alpha1.VolumePhaseReady) {
		t.Fatalf("r10v %s after FailDisk: %v, want Ready with 3/4 members", volName, row)
	}

	// A replacement: Rebuilding with a growing percentage, then Healthy with 4/4.
	if _, err := pl.ReplaceDisk(paths[1], pool.DiskConfig{Path: paths[4]}); err != nil {
		t.Fatalf("ReplaceDisk %s with %s: %v", paths[1], paths[4], err)
	}
	var percents []float64
	var rows []string
	d = waitFor(t, 2*time.Minute, "r10v Healthy 4/4 after the rebuild", func() (bool, string) {
		row = cl.tableRow(ctx, t, "raid10volumes", volName)
		if s := fmt.Sprint(row["Health"], " ", row["Members"], " ", row["Rebuild"]); len(rows) == 0 || rows[len(rows)-1] != s {
			rows = append(rows, s)
		}
		if row["Health"] == string(v1alpha1.VolumeHealthRebuilding) {
			if p, ok := row["Rebuild"].(float64); ok && (len(percents) == 0 || percents[len(percents)-1] != p) {
				percents = append(percents, p)
			}
		}
		return row["Health"] == string(v1alpha1.VolumeHealthHealthy) && row["Members"] == "4/4", fmt.Sprint(row)
	})
	t.Logf("rebuild to Healthy in %v; HEALTH MEMBERS REBUILD seen: %q", d.Round(time.Millisecond), rows)
	if len(percents) < 2 || !slices.IsSorted(percents) || percents[0] < 0 || percents[len(percents)-1] > 100 {
		t.Fatalf("REBUILD column while Rebuilding: %v, want at least two rising percentages", percents)
	}
	if row["Rebuild"] != nil {
		t.Fatalf("r10v %s after the rebuild: %v, want no REBUILD value", volName, row)
	}
	if err := pl.Check(); err != nil {
		t.Fatalf("pool check after the rebuild: %v", err)
	}

	// ControllerExpandVolume: the agent grows the extents in place; node expansion is asked
	// for a block volume too (its /dev/nbdX learns the new size on the node).
	begin = time.Now()
	cctx, cancel = call()
	exp, err := ctrl.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: volName, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * volSize},
	})
	cancel()
	if err != nil {
		t.Fatalf("ControllerExpandVolume to %d bytes: %v", 2*volSize, err)
	}
	t.Logf("ControllerExpandVolume answered in %v: %d bytes, node expansion %v", time.Since(begin).Round(time.Millisecond), exp.GetCapacityBytes(), exp.GetNodeExpansionRequired())
	if exp.GetCapacityBytes() < 2*volSize || !exp.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpandVolume answered %v, want at least %d bytes and node expansion (block: the device grows on the node)", exp, 2*volSize)
	}
	if vi, err := pl.Volume(volName); err != nil || vi.Size < 2*volSize {
		t.Fatalf("pool volume %s after ControllerExpandVolume: %+v, %v; want at least %d bytes", volName, vi, err, 2*volSize)
	}
	row = cl.tableRow(ctx, t, "raid10volumes", volName)
	if row["Size"] != "128Mi" || row["State"] != string(v1alpha1.VolumePhaseReady) || row["Health"] != string(v1alpha1.VolumeHealthHealthy) {
		t.Fatalf("r10v %s after ControllerExpandVolume: %v, want 128Mi, Ready, Healthy", volName, row)
	}
	if freeAfterExpand := waitCapacity("after ControllerExpandVolume"); freeAfterExpand >= freeAfterCreate {
		t.Fatalf("GetCapacity after ControllerExpandVolume %d, after CreateVolume %d: the growth took no space", freeAfterExpand, freeAfterCreate)
	}

	// DeleteVolume: answered once the agent freed the extents; the space comes back.
	begin = time.Now()
	cctx, cancel = call()
	_, err = ctrl.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: volName})
	cancel()
	if err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	t.Logf("DeleteVolume answered in %v", time.Since(begin).Round(time.Millisecond))
	if _, err := cl.getVolume(ctx, volName); !apierrors.IsNotFound(err) {
		t.Fatalf("Raid10Volume %s after DeleteVolume: %v, want NotFound", volName, err)
	}
	if _, err := pl.Volume(volName); err == nil {
		t.Fatalf("the pool still has volume %s after DeleteVolume", volName)
	}
	if err := pl.Check(); err != nil {
		t.Fatalf("pool check after DeleteVolume: %v", err)
	}
	if freeAfterDelete := waitCapacity("after DeleteVolume"); freeAfterDelete != freeBefore {
		t.Fatalf("GetCapacity after DeleteVolume %d, before CreateVolume %d: the space did not come back", freeAfterDelete, freeBefore)
	}
	// Delete is idempotent.
	cctx, cancel = call()
	_, err = ctrl.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: volName})
	cancel()
	if err != nil {
		t.Fatalf("second DeleteVolume: %v, want success", err)
	}
}
