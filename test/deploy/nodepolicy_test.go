package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// ownNodePolicy is the chart's ValidatingAdmissionPolicy (templates/node-admission.yaml).
const ownNodePolicy = "raid10-csi-node-own-objects"

// nodeChangesOnlyItsOwnObjects plays two node plugins, on node-a and node-b, each with the
// node ServiceAccount's token bound to a pod on its node (as the kubelet projects it), and
// checks on the real API server that deploy/'s admission policy lets each change its own
// node's Raid10Volume, Raid10Snapshot and Raid10Node and denies it another node's, with the
// policy's message; and that a token naming no node may change none. Without the policy
// every write below is allowed by RBAC. (The policy's type check against the CRDs is made
// by kube-controller-manager, which this control plane does not run: every expression is
// evaluated here instead, and an evaluation error would deny an allowed write.)
func nodeChangesOnlyItsOwnObjects(t *testing.T, env *kubeenv.Env) {
	ctx := t.Context()
	admin := raid10Client(t, env.Config)
	agentA := raid10Client(t, env.NodeServiceAccountConfig(t, namespace, "raid10-csi-node", "node-a"))
	agentB := raid10Client(t, env.NodeServiceAccountConfig(t, namespace, "raid10-csi-node", "node-b"))
	unbound := raid10Client(t, env.ServiceAccountConfig(t, namespace, "raid10-csi-node"))

	for _, node := range []string{"node-a", "node-b"} {
		v := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
			Node: node, SizeBytes: gib, VolumeMode: v1alpha1.VolumeModeBlock,
			Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
		}}
		v.Name = "vol-" + node
		v.Finalizers = []string{v1alpha1.VolumeFinalizer}
		s := &v1alpha1.Raid10Snapshot{Spec: v1alpha1.Raid10SnapshotSpec{Source: v.Name, Node: node}}
		s.Name = "snap-" + node
		for _, o := range []client.Object{v, s} {
			if err := admin.Create(ctx, o); err != nil {
				t.Fatalf("admin creates %s: %v", o.GetName(), err)
			}
		}
	}

	// The policy is enforced once the API server's informer has it: the first cross-node
	// write may still pass, so wait until one is denied.
	var denied error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		denied = setVolumePhase(t, agentA, "vol-node-b", v1alpha1.VolumePhasePending)
		return denied != nil, nil
	})
	if err != nil {
		t.Fatalf("node-a's agent still updates node-b's Raid10Volume status after 30s: the admission policy %s is not enforced", ownNodePolicy)
	}
	wantDenied(t, denied, "node-a", "update", "Raid10Volume vol-node-b (status) of node node-b")
	t.Logf("cross-node status update denied: %v", denied)

	// Its own volume's status: allowed.
	if err := setVolumePhase(t, agentA, "vol-node-a", v1alpha1.VolumePhaseReady); err != nil {
		t.Fatalf("node-a's agent updates its own Raid10Volume status: %v", err)
	}
	// The main resource (the finalizer removal at delete): own allowed, other denied.
	wantDenied(t, removeFinalizer(t, agentA, "vol-node-b"), "node-a", "update", "Raid10Volume vol-node-b of node node-b")
	if err := removeFinalizer(t, agentA, "vol-node-a"); err != nil {
		t.Fatalf("node-a's agent removes its own volume's finalizer: %v", err)
	}

	// Snapshot status: node-b's own allowed, node-a's agent denied.
	if err := setSnapshotPhase(t, agentB, "snap-node-b", v1alpha1.SnapshotPhaseReady); err != nil {
		t.Fatalf("node-b's agent updates its own Raid10Snapshot status: %v", err)
	}
	wantDenied(t, setSnapshotPhase(t, agentA, "snap-node-b", v1alpha1.SnapshotPhaseFailed), "node-a", "update", "Raid10Snapshot snap-node-b (status) of node node-b")

	// Raid10Node: each creates its own; node-a may neither create nor update node-b's.
	wantDenied(t, agentA.Create(ctx, &v1alpha1.Raid10Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}), "node-a", "create", "Raid10Node node-b of node node-b")
	for _, c := range []struct {
		agent client.Client
		node  string
	}{{agentA, "node-a"}, {agentB, "node-b"}} {
		if err := c.agent.Create(ctx, &v1alpha1.Raid10Node{ObjectMeta: metav1.ObjectMeta{Name: c.node}}); err != nil {
			t.Fatalf("%s's agent creates its Raid10Node: %v", c.node, err)
		}
	}
	wantDenied(t, setNodeDisks(t, agentA, "node-b", 4), "node-a", "update", "Raid10Node node-b (status) of node node-b")
	if err := setNodeDisks(t, agentA, "node-a", 4); err != nil {
		t.Fatalf("node-a's agent updates its Raid10Node status: %v", err)
	}

	// A token of the node ServiceAccount bound to no pod names no node: denied even on node-a.
	err = setVolumePhase(t, unbound, "vol-node-a", v1alpha1.VolumePhaseReady)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "this token names no node") {
		t.Fatalf("unbound node token updates a volume status: %v, want Forbidden naming the missing node claim", err)
	}
}

// wantDenied fails the test unless err is the policy's denial of node's op on what.
func wantDenied(t *testing.T, err error, node, op, what string) {
	t.Helper()
	want := "the node plugin of node " + node + " may not " + op + " " + what
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), ownNodePolicy) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want Forbidden by %s with %q", err, ownNodePolicy, want)
	}
}

// The agent reads through list (no get on volumes): these find the object in a list.

func listVolume(t *testing.T, c client.Client, name string) *v1alpha1.Raid10Volume {
	t.Helper()
	var l v1alpha1.Raid10VolumeList
	if err := c.List(t.Context(), &l); err != nil {
		t.Fatalf("list volumes: %v", err)
	}
	for i := range l.Items {
		if l.Items[i].Name == name {
			return &l.Items[i]
		}
	}
	t.Fatalf("no Raid10Volume %s", name)
	return nil
}

func setVolumePhase(t *testing.T, c client.Client, name string, phase v1alpha1.VolumePhase) error {
	t.Helper()
	v := listVolume(t, c, name)
	v.Status.Phase = phase
	return c.Status().Update(t.Context(), v)
}

func removeFinalizer(t *testing.T, c client.Client, name string) error {
	t.Helper()
	v := listVolume(t, c, name)
	v.Finalizers = nil
	return c.Update(t.Context(), v)
}

func setSnapshotPhase(t *testing.T, c client.Client, name string, phase v1alpha1.SnapshotPhase) error {
	t.Helper()
	var l v1alpha1.Raid10SnapshotList
	if err := c.List(t.Context(), &l); err != nil {
		t.Fatalf("list snapshots: %v", err)
	}
	for i := range l.Items {
		if s := &l.Items[i]; s.Name == name {
			s.Status.Phase = phase
			return c.Status().Update(t.Context(), s)
		}
	}
	t.Fatalf("no Raid10Snapshot %s", name)
	return nil
}

func setNodeDisks(t *testing.T, c client.Client, name string, disks int32) error {
	t.Helper()
	var l v1alpha1.Raid10NodeList
	if err := c.List(t.Context(), &l); err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	for i := range l.Items {
		if n := &l.Items[i]; n.Name == name {
			n.Status.DiskCount = disks
			return c.Status().Update(t.Context(), n)
		}
	}
	t.Fatalf("no Raid10Node %s", name)
	return nil
}
