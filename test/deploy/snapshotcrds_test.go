package deploy_test

import (
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// TestHelmInstallSnapshotCRDs installs the chart with helm on a real kube-apiserver that does
// not serve the snapshot API, as a bare cluster: with the defaults it installs without a
// VolumeSnapshotClass; an upgrade that sets snapshots.installCRDs cannot add CRDs (helm installs
// crds/ only at install) and says so instead of failing; a fresh install with it creates the
// three CRDs before it renders, so the driver's VolumeSnapshotClass of the same install is
// created too (as templates, helm mapped the class before the CRDs existed and refused the
// whole install: "no matches for kind VolumeSnapshotClass"); an uninstall keeps the CRDs, and
// with them the cluster's VolumeSnapshots.
func TestHelmInstallSnapshotCRDs(t *testing.T) {
	bin := helmBinary(t)
	env := kubeenv.Start(t, kubeenv.WithAPIServerFlags("--endpoint-reconciler-type=none"))
	ctx := t.Context()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	classes := dyn.Resource(schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"})
	helmOK := func(args ...string) string {
		t.Helper()
		args = append(args, "--namespace", namespace, "--kubeconfig", env.Kubeconfig)
		out, stderr, err := helm(t, bin, args...)
		if err != nil {
			t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
		}
		return out
	}
	snapshotCRDs := func() int {
		t.Helper()
		n := 0
		for _, kind := range []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"} {
			_, err := crds.Get(ctx, kind+".snapshot.storage.k8s.io", metav1.GetOptions{})
			switch {
			case err == nil:
				n++
			case !apierrors.IsNotFound(err):
				t.Fatal(err)
			}
		}
		return n
	}
	chart, err := filepath.Abs(chartDir)
	if err != nil {
		t.Fatal(err)
	}

	helmOK("install", "plain", chart, "--create-namespace")
	if n := snapshotCRDs(); n != 0 {
		t.Fatalf("defaults installed %d snapshot CRDs, want none", n)
	}
	notes := helmOK("upgrade", "plain", chart, "--reuse-values", "--set", "snapshots.installCRDs=true")
	if n := snapshotCRDs(); n != 0 || !strings.Contains(notes, "charts/snapshot-crds/crds") {
		t.Fatalf("upgrade with installCRDs: %d snapshot CRDs (helm creates crds/ only at install), NOTES without the way to apply them:\n%s", n, notes)
	}
	helmOK("uninstall", "plain", "--wait")

	helmOK("install", "snap", chart, "--set", "snapshots.installCRDs=true", "--set", "snapshots.controller.enabled=true")
	if n := snapshotCRDs(); n != 3 {
		t.Fatalf("installCRDs: %d snapshot CRDs, want 3", n)
	}
	vsc, err := classes.Get(ctx, "raid10", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("installCRDs: the chart's VolumeSnapshotClass: %v", err)
	}
	if vsc.Object["driver"] != "raid10.csi.io" {
		t.Fatalf("VolumeSnapshotClass raid10: driver %v", vsc.Object["driver"])
	}
	helmOK("uninstall", "snap", "--wait")
	if n := snapshotCRDs(); n != 3 {
		t.Fatalf("after uninstall: %d snapshot CRDs, want the 3 kept", n)
	}
	if _, err := classes.Get(ctx, "raid10", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after uninstall: the release's VolumeSnapshotClass: %v, want NotFound", err)
	}
}
