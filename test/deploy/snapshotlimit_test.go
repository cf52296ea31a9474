package deploy_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestHelmSnapshotLimits: the chart's snapshot space values reach the VolumeSnapshotClass
// and the StorageClass as the parameters CreateSnapshot reads (docs/parameters.md,
// "Snapshot limits"); the defaults set none.
func TestHelmSnapshotLimits(t *testing.T) {
	bin := helmBinary(t)
	api := []string{"--api-versions", "snapshot.storage.k8s.io/v1/VolumeSnapshotClass"}
	params := func(o *unstructured.Unstructured) map[string]string {
		t.Helper()
		if o == nil {
			t.Fatal("object not rendered")
		}
		p, _, _ := unstructured.NestedStringMap(o.Object, "parameters")
		return p
	}
	if p := params(find(renderChart(t, bin, api...), "VolumeSnapshotClass", "raid10")); len(p) != 0 {
		t.Errorf("default VolumeSnapshotClass parameters %v, want none", p)
	}
	objs := renderChart(t, bin, append(api,
		"--set", "snapshots.volumeSnapshotClass.maxSnapshots=4",
		"--set", "snapshots.volumeSnapshotClass.maxSnapshotBytesPerNode=500Gi",
		"--set", "storageClass.parameters.maxSnapshots=2")...)
	if p := params(find(objs, "VolumeSnapshotClass", "raid10")); p["maxSnapshots"] != "4" || p["maxSnapshotBytesPerNode"] != "500Gi" || len(p) != 2 {
		t.Errorf("VolumeSnapshotClass parameters %v, want maxSnapshots 4, maxSnapshotBytesPerNode 500Gi", p)
	}
	if p := params(find(objs, "StorageClass", "raid10")); p["maxSnapshots"] != "2" {
		t.Errorf("StorageClass parameters %v, want maxSnapshots 2", p)
	}
	if _, stderr, err := helm(t, bin, "template", "raid10-csi", chartDir, "--kube-version", kubeVersion,
		"--set", "snapshots.volumeSnapshotClass.maxSnapshotBytesPerNode=lots"); err == nil {
		t.Errorf("maxSnapshotBytesPerNode=lots rendered; want the schema to refuse it (%s)", stderr)
	}
}
