package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

const (
	manifest  = "../../deploy/raid10-csi.yaml"
	namespace = "raid10-csi"
)

func readObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var u unstructured.Unstructured
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", manifest, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, &u)
		}
	}
}

// TestManifestsApplyAndRBAC creates every object of deploy/raid10-csi.yaml in a real API
// server (which validates them, CRDs first), then asks the RBAC authorizer what each
// ServiceAccount may do.
func TestManifestsApplyAndRBAC(t *testing.T) {
	objs := readObjects(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for _, k := range []string{"Namespace", "CustomResourceDefinition", "CSIDriver", "Deployment", "DaemonSet", "StorageClass", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		if kinds[k] == 0 {
			t.Errorf("%s has no %s", manifest, k)
		}
	}

	// No endpoint reconciler: kube-apiserver v1.37 refuses to reconcile the "kubernetes"
	// Service endpoints to a loopback --advertise-address, and these tests need none.
	env := kubeenv.Start(t, kubeenv.WithAPIServerFlags("--endpoint-reconciler-type=none"))
	ctx := t.Context()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot API, as on a cluster that serves it (deploy/ has the VolumeSnapshotClass).
	env.InstallCRDs(t, filepath.Join(chartDir, "charts", "snapshot-crds", "crds"))
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery()))
	create := func(o *unstructured.Unstructured) {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s: %v", gvk.Kind, o.GetName(), err)
		}
	}
	// Namespace and CRDs first, as kubectl apply of the directory would need a retry for.
	first := func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition"
	}
	for _, o := range objs {
		if first(o) {
			create(o)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		mapper.Reset()
		_, err := mapper.RESTMapping(schema.GroupKind{Group: "raid10.csi.io", Kind: "Raid10Volume"}, "v1alpha1")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("CRDs not served: %v", err)
	}
	for _, o := range objs {
		if !first(o) {
			create(o)
		}
	}

	controller := "system:serviceaccount:" + namespace + ":raid10-csi-controller"
	node := "system:serviceaccount:" + namespace + ":raid10-csi-node"
	for _, tc := range []struct {
		name  string
		user  string
		attr  authorizationv1.ResourceAttributes
		allow bool
	}{
		{"ControllerCreatesVolumes", controller, ra("raid10.csi.io", "raid10volumes", "", "", "create"), true},
		{"ControllerDeletesVolumes", controller, ra("raid10.csi.io", "raid10volumes", "", "", "delete"), true},
		{"ControllerReadsNodes", controller, ra("raid10.csi.io", "raid10nodes", "", "", "list"), true},
		{"ControllerCannotWriteNodes", controller, ra("raid10.csi.io", "raid10nodes", "", "", "update"), false},
		{"ControllerCannotWriteVolumeStatus", controller, ra("raid10.csi.io", "raid10volumes", "status", "", "update"), false},
		{"ProvisionerCreatesPVs", controller, ra("", "persistentvolumes", "", "", "create"), true},
		{"ProvisionerPublishesCapacity", controller, ra("storage.k8s.io", "csistoragecapacities", "", namespace, "create"), true},
		{"CapacityOnlyInItsNamespace", controller, ra("storage.k8s.io", "csistoragecapacities", "", "default", "create"), false},
		{"LeaderElection", controller, ra("coordination.k8s.io", "leases", "", namespace, "update"), true},
		{"ResizerPatchesClaimStatus", controller, ra("", "persistentvolumeclaims", "status", "default", "patch"), true},
		{"ControllerCannotReadSecrets", controller, ra("", "secrets", "", "default", "get"), false},
		{"ControllerCannotCreatePods", controller, ra("", "pods", "", namespace, "create"), false},
		{"ControllerCreatesSnapshots", controller, ra("raid10.csi.io", "raid10snapshots", "", "", "create"), true},
		{"ControllerCannotWriteSnapshotStatus", controller, ra("raid10.csi.io", "raid10snapshots", "status", "", "update"), false},
		{"SnapshotterPatchesContentStatus", controller, ra("snapshot.storage.k8s.io", "volumesnapshotcontents", "status", "", "patch"), true},
		{"ProvisionerReadsSnapshots", controller, ra("snapshot.storage.k8s.io", "volumesnapshots", "", "default", "get"), true},
		{"AgentWritesSnapshotStatus", node, ra("raid10.csi.io", "raid10snapshots", "status", "", "update"), true},
		{"AgentCannotCreateSnapshots", node, ra("raid10.csi.io", "raid10snapshots", "", "", "create"), false},
		{"AgentWritesVolumeStatus", node, ra("raid10.csi.io", "raid10volumes", "status", "", "update"), true},
		{"AgentRemovesFinalizer", node, ra("raid10.csi.io", "raid10volumes", "", "", "update"), true},
		{"AgentCannotCreateVolumes", node, ra("raid10.csi.io", "raid10volumes", "", "", "create"), false},
		{"AgentCannotDeleteVolumes", node, ra("raid10.csi.io", "raid10volumes", "", "", "delete"), false},
		{"AgentKeepsItsNode", node, ra("raid10.csi.io", "raid10nodes", "status", "", "update"), true},
		{"AgentCannotTouchPVs", node, ra("", "persistentvolumes", "", "", "delete"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attr := tc.attr
			sar, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: tc.user, ResourceAttributes: &attr},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed != tc.allow {
				t.Fatalf("%s %s %s/%s in %q: allowed=%v, want %v (%s)", tc.user, attr.Verb, attr.Resource, attr.Subresource, attr.Namespace, sar.Status.Allowed, tc.allow, sar.Status.Reason)
			}
		})
	}

	t.Run("ServiceAccountsDoTheirJobs", func(t *testing.T) { serviceAccountsDoTheirJobs(t, env) })
	t.Run("NodeChangesOnlyItsOwnObjects", func(t *testing.T) { nodeChangesOnlyItsOwnObjects(t, env) })

	// The StorageClass is the documented one.
	sc := objs[slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "StorageClass" })]
	if got, _, _ := unstructured.NestedString(sc.Object, "volumeBindingMode"); got != "WaitForFirstConsumer" {
		t.Errorf("StorageClass volumeBindingMode %q", got)
	}
	if got, _, _ := unstructured.NestedBool(sc.Object, "allowVolumeExpansion"); !got {
		t.Error("StorageClass does not allow expansion")
	}
}

func ra(group, resource, sub, ns, verb string) authorizationv1.ResourceAttributes {
	return authorizationv1.ResourceAttributes{Group: group, Resource: resource, Subresource: sub, Namespace: ns, Verb: verb}
}
