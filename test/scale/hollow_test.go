package scale

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestHollowNodes: ten hollow nodes on the real kube-apiserver, with the real controller
// plugin and csi-provisioner. Every node's disks reach its Raid10Node and the provisioner's
// CSIStorageCapacity for its topology segment; 20 volumes, spread two to a node, are
// created through the controller's CreateVolume (which returns once the node's agent
// reports the volume Ready), each lands in the pool of the node it was asked for, and
// DeleteVolume removes them all: no Raid10Volume left, every pool empty again.
func TestHollowNodes(t *testing.T) {
	const (
		nodes   = 10
		perNode = 2
		size    = 256 << 20
	)
	cl := startCluster(t, 2*time.Second)
	cl.addNodes(t, nodes)
	toNode, toCap := cl.reported(t, cl.nodes, 2*time.Minute)
	t.Logf("%d hollow nodes: Raid10Node by %v, CSIStorageCapacity by %v (slowest)",
		nodes, slices.Max(toNode).Round(time.Millisecond), slices.Max(toCap).Round(time.Millisecond))

	ctx := t.Context()
	name := func(i int) string { return fmt.Sprintf("pvc-%04d", i) }
	nodeOf := func(i int) *Node { return cl.nodes[i%nodes] }
	run := func(what string, op func(i int) error) {
		t.Helper()
		errs := make([]error, nodes*perNode)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = op(i) }()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	ids := make([]string, nodes*perNode)
	t0 := time.Now()
	run("CreateVolume", func(i int) error {
		var err error
		if ids[i], err = cl.createVolume(ctx, name(i), nodeOf(i).Name, size); err != nil {
			return fmt.Errorf("%s on %s: %w", name(i), nodeOf(i).Name, err)
		}
		return nil
	})
	created := time.Since(t0)
	for i := range nodes * perNode {
		v, err := nodeOf(i).Pool.Volume(ids[i])
		if err != nil || v.Size < size {
			t.Fatalf("volume %s in the pool of %s: %+v, %v", ids[i], nodeOf(i).Name, v, err)
		}
	}
	var vols v1alpha1.Raid10VolumeList
	if err := cl.c.List(ctx, &vols); err != nil {
		t.Fatal(err)
	}
	for _, v := range vols.Items {
		if v.Status.Phase != v1alpha1.VolumePhaseReady {
			t.Errorf("Raid10Volume %s on %s: phase %q, want Ready", v.Name, v.Spec.Node, v.Status.Phase)
		}
	}
	if len(vols.Items) != nodes*perNode {
		t.Fatalf("%d Raid10Volumes, want %d", len(vols.Items), nodes*perNode)
	}

	t0 = time.Now()
	run("DeleteVolume", func(i int) error {
		_, err := cl.csi.DeleteVolume(ctx, deleteRequest(ids[i]))
		return err
	})
	deleted := time.Since(t0)
	if err := cl.c.List(ctx, &vols); err != nil || len(vols.Items) != 0 {
		t.Fatalf("Raid10Volumes after DeleteVolume: %d (%v), want none", len(vols.Items), err)
	}
	for _, nd := range cl.nodes {
		if st := nd.Pool.Status(); len(st.Volumes) != 0 {
			t.Errorf("pool of %s still holds %d volumes", nd.Name, len(st.Volumes))
		}
	}
	t.Logf("%d volumes on %d nodes: created in %v, deleted in %v", nodes*perNode, nodes,
		created.Round(time.Millisecond), deleted.Round(time.Millisecond))
}
