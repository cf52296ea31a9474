package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

const gib = int64(1) << 30

func raid10Client(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serviceAccountsDoTheirJobs runs the controller service as the chart's controller
// ServiceAccount and plays the node agent's API writes as the node ServiceAccount: the RBAC
// of deploy/ is enough for both, end to end.
func serviceAccountsDoTheirJobs(t *testing.T, env *kubeenv.Env) {
	ctx := t.Context()
	ctrl := raid10Client(t, env.ServiceAccountConfig(t, namespace, "raid10-csi-controller"))
	// The agent's token is bound to its pod on node-1, as the kubelet projects it: the
	// chart's admission policy lets the node ServiceAccount change only its node's objects.
	agent := raid10Client(t, env.NodeServiceAccountConfig(t, namespace, "raid10-csi-node", "node-1"))

	// The agent registers its pool.
	n := &v1alpha1.Raid10Node{}
	n.Name = "node-1"
	if err := agent.Create(ctx, n); err != nil {
		t.Fatalf("agent creates its Raid10Node: %v", err)
	}
	for i := range 4 {
		n.Status.Disks = append(n.Status.Disks, v1alpha1.DiskStatus{ID: "disk" + string(rune('a'+i)), SizeBytes: 10 * gib, FreeBytes: 10 * gib, State: v1alpha1.DiskStateHealthy})
	}
	n.Status.DiskCount, n.Status.HealthyDisks = 4, 4
	n.Status.Capacity = v1alpha1.NodeCapacity{Raw: *resource.NewQuantity(40*gib, resource.BinarySI), Usable: *resource.NewQuantity(20*gib, resource.BinarySI), Free: *resource.NewQuantity(20*gib, resource.BinarySI)}
	if err := agent.Status().Update(ctx, n); err != nil {
		t.Fatalf("agent writes its Raid10Node status: %v", err)
	}

	// The controller plugin, as its ServiceAccount.
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, err := driver.NewDriver(driver.WithEndpoint("unix://"+sock), driver.WithVolumeStore(driver.NewKubeStore(ctrl)),
		driver.WithReadyTimeout(2*time.Second), driver.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(dctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal("driver socket never appeared")
		}
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cc := csi.NewControllerClient(conn)

	topo := &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-1"}}
	capResp, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: topo})
	if err != nil || capResp.GetAvailableCapacity() != 20*gib {
		t.Fatalf("GetCapacity = %v, %v", capResp, err)
	}
	req := &csi.CreateVolumeRequest{
		Name:          "pvc-rbac",
		CapacityRange: &csi.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		AccessibilityRequirements: &csi.TopologyRequirement{Preferred: []*csi.Topology{topo}},
	}
	// No agent has answered yet: the volume is created, the call times out.
	if _, err := cc.CreateVolume(ctx, req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("CreateVolume before the agent: %v", err)
	}
	// The agent reports it Ready.
	// The agent reads through its informer cache (list and watch, never get).
	agentVolume := func() v1alpha1.Raid10Volume {
		t.Helper()
		var l v1alpha1.Raid10VolumeList
		if err := agent.List(ctx, &l); err != nil {
			t.Fatalf("agent lists the volumes: %v", err)
		}
		for _, v := range l.Items {
			if v.Name == "pvc-rbac" {
				return v
			}
		}
		t.Fatalf("agent lists %d volumes, none is pvc-rbac", len(l.Items))
		return v1alpha1.Raid10Volume{}
	}
	vol := agentVolume()
	vol.Status.ObservedGeneration = vol.Generation
	vol.Status.Phase, vol.Status.Health, vol.Status.InSync = v1alpha1.VolumePhaseReady, v1alpha1.VolumeHealthHealthy, "4/4"
	vol.Status.Capacity = resource.NewQuantity(gib, resource.BinarySI)
	meta.SetStatusCondition(&vol.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Provisioned"})
	if err := agent.Status().Update(ctx, &vol); err != nil {
		t.Fatalf("agent writes the volume status: %v", err)
	}
	if resp, err := cc.CreateVolume(ctx, req); err != nil || resp.GetVolume().GetVolumeId() != "pvc-rbac" {
		t.Fatalf("CreateVolume after the agent: %v, %v", resp, err)
	}
	if l, err := cc.ListVolumes(ctx, &csi.ListVolumesRequest{}); err != nil || len(l.GetEntries()) != 1 {
		t.Fatalf("ListVolumes = %v, %v", l, err)
	}
	// Deletion waits for the agent's finalizer removal.
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-rbac"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("DeleteVolume before the agent: %v", err)
	}
	vol = agentVolume()
	vol.Finalizers = slices.DeleteFunc(vol.Finalizers, func(f string) bool { return f == v1alpha1.VolumeFinalizer })
	if err := agent.Update(ctx, &vol); err != nil {
		t.Fatalf("agent removes the finalizer: %v", err)
	}
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-rbac"}); err != nil {
		t.Fatalf("DeleteVolume after the agent: %v", err)
	}
}
