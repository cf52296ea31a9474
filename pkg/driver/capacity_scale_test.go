package driver

import (
	"context"
	"fmt"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestCapacityListsOnlyItsNode: a node's capacity (GetCapacity for its topology segment,
// which csi-provisioner asks for every node each capacity poll) reads that node's volumes
// and snapshots only, not the cluster's (issue 28: with every volume listed, the poll cost
// grew as nodes x volumes). 40 pending volumes on other nodes and one on node-a: node-a's
// capacity subtracts its own and the lists return one object in all.
func TestCapacityListsOnlyItsNode(t *testing.T) {
	ctx := context.Background()
	listed := 0
	c := interceptor.NewClient(fakeClient(t).(client.WithWatch), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			err := c.List(ctx, l, opts...)
			listed += meta.LenList(l)
			return err
		},
	})
	const disk = 64 << 30
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		newNode(ctx, t, c, n, 4, disk)
	}
	vol := func(name, node string) {
		v := &v1alpha1.Raid10Volume{}
		v.Name = name
		v.Spec.Node, v.Spec.SizeBytes = node, 1<<30
		v.Spec.Layout = v1alpha1.Layout{Members: 4, ChunkSizeBytes: DefaultChunkSizeBytes}
		if err := c.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		vol(fmt.Sprintf("other-%d", i), []string{"node-b", "node-c"}[i%2])
	}
	vol("mine", "node-a")
	ctrl, _ := startDriver(t, c, DefaultReadyTimeout)
	listed = 0
	resp, err := ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{
		Parameters:         map[string]string{ParamMembers: "4"},
		AccessibleTopology: &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(disk*4/2 - 1<<30); resp.GetAvailableCapacity() != want {
		t.Errorf("node-a's capacity %d, want %d (its disks less its pending volume)", resp.GetAvailableCapacity(), want)
	}
	if listed != 1 {
		t.Errorf("GetCapacity for node-a listed %d objects, want 1 (its own volume; 41 volumes in the cluster)", listed)
	}
}
