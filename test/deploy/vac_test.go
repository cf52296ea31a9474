package deploy_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestHelmVolumeAttributesClasses: the chart renders no VolumeAttributesClass by default,
// and the ones volumeAttributesClasses asks for as storage.k8s.io/v1 classes of the driver
// with their parameters as strings; its schema refuses a key that is no QoS limit and a
// malformed value, in a class and in the StorageClass alike, and the template refuses a
// Kubernetes that does not serve storage.k8s.io/v1 VolumeAttributesClass (before 1.34).
func TestHelmVolumeAttributesClasses(t *testing.T) {
	bin := helmBinary(t)
	for _, o := range renderChart(t, bin) {
		if o.GetKind() == "VolumeAttributesClass" {
			t.Fatalf("default values render VolumeAttributesClass %s, want none", o.GetName())
		}
	}
	classes := `volumeAttributesClasses=[` +
		`{"name":"raid10-silver","parameters":{"maxReadIOPS":2000,"maxWriteIOPS":"1000","maxReadBytesPerSecond":"200Mi","maxWriteBytesPerSecond":"100Mi","maxWriteBytesBurst":"16Mi"}},` +
		`{"name":"raid10-unlimited","parameters":{"maxReadIOPS":"0","maxWriteIOPS":"0"}}]`
	objs := renderChart(t, bin, "--set-json", classes, "--set-string", "storageClass.parameters.maxWriteIOPS=500")
	for _, c := range []struct {
		name string
		want map[string]string
	}{
		{"raid10-silver", map[string]string{"maxReadIOPS": "2000", "maxWriteIOPS": "1000", "maxReadBytesPerSecond": "200Mi",
			"maxWriteBytesPerSecond": "100Mi", "maxWriteBytesBurst": "16Mi"}},
		{"raid10-unlimited", map[string]string{"maxReadIOPS": "0", "maxWriteIOPS": "0"}},
	} {
		o := find(objs, "VolumeAttributesClass", c.name)
		if o == nil {
			t.Fatalf("no VolumeAttributesClass %s in %v", c.name, kindsOf(objs))
		}
		if o.GetAPIVersion() != "storage.k8s.io/v1" {
			t.Errorf("%s: apiVersion %s, want storage.k8s.io/v1", c.name, o.GetAPIVersion())
		}
		if d, _, _ := unstructured.NestedString(o.Object, "driverName"); d != "raid10.csi.io" {
			t.Errorf("%s: driverName %q", c.name, d)
		}
		if p, _, _ := unstructured.NestedStringMap(o.Object, "parameters"); !equalMaps(p, c.want) {
			t.Errorf("%s: parameters %v, want %v", c.name, p, c.want)
		}
	}
	if p, _, _ := unstructured.NestedStringMap(find(objs, "StorageClass", "raid10").Object, "parameters"); p["maxWriteIOPS"] != "500" {
		t.Errorf("StorageClass parameters %v, want maxWriteIOPS 500", p)
	}

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"UnknownKey", []string{"--set-json", `volumeAttributesClasses=[{"name":"a","parameters":{"maxReadIops":"1"}}]`}, "maxReadIops"},
		{"LayoutKey", []string{"--set-json", `volumeAttributesClasses=[{"name":"a","parameters":{"members":"4"}}]`}, "members"},
		{"FractionalIOPS", []string{"--set-json", `volumeAttributesClasses=[{"name":"a","parameters":{"maxWriteIOPS":"1.5"}}]`}, "maxWriteIOPS"},
		{"BadQuantity", []string{"--set-json", `volumeAttributesClasses=[{"name":"a","parameters":{"maxReadBytesPerSecond":"lots"}}]`}, "maxReadBytesPerSecond"},
		{"NoParameters", []string{"--set-json", `volumeAttributesClasses=[{"name":"a","parameters":{}}]`}, "parameters"},
		{"BadName", []string{"--set-json", `volumeAttributesClasses=[{"name":"Silver","parameters":{"maxReadIOPS":"1"}}]`}, "name"},
		{"StorageClassBadLimit", []string{"--set-string", "storageClass.parameters.maxReadIOPS=-1"}, "maxReadIOPS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, err := helm(t, bin, append([]string{"template", "raid10-csi", chartDir, "--kube-version", kubeVersion}, c.args...)...)
			if err == nil || !strings.Contains(stderr, c.want) {
				t.Fatalf("rendered (err %v); want the schema to refuse it naming %q:\n%s", err, c.want, stderr)
			}
		})
	}
	_, stderr, err := helm(t, bin, "template", "raid10-csi", chartDir, "--kube-version", "1.33.0",
		"--set-json", `volumeAttributesClasses=[{"name":"a","parameters":{"maxReadIOPS":"1"}}]`)
	if err == nil || !strings.Contains(stderr, "needs Kubernetes 1.34") {
		t.Fatalf("classes rendered for Kubernetes 1.33 (err %v); want a failure saying 1.34 is needed:\n%s", err, stderr)
	}
}
