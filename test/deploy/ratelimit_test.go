package deploy_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestHelmRateLimits: the API rate limits of the plugin's and the sidecars' Kubernetes
// clients and the provisioner's threads (docs/install.md, "API rate limits") reach their
// containers' flags, with the defaults and with values set; the schema refuses a rate of 0,
// a burst or thread count below 1 and a word.
func TestHelmRateLimits(t *testing.T) {
	bin := helmBinary(t)
	api := []string{"--api-versions", "snapshot.storage.k8s.io/v1/VolumeSnapshotClass"}
	// want names, per Deployment or DaemonSet and container, the flags it must carry.
	type want map[[2]string][]string
	check := func(t *testing.T, objs []*unstructured.Unstructured, w want) {
		t.Helper()
		for key, flags := range w {
			args := containerArgs(t, objs, key[0], key[1])
			for _, f := range flags {
				if !slices.Contains(args, f) {
					t.Errorf("%s/%s args %v lack %s", key[0], key[1], args, f)
				}
			}
		}
	}
	t.Run("Defaults", func(t *testing.T) {
		check(t, renderChart(t, bin, api...), want{
			{"raid10-csi-controller", "raid10-csi"}: {"--kube-api-qps=100", "--kube-api-burst=200"},
			{"raid10-csi-controller", "csi-provisioner"}: {"--kube-api-qps=50", "--kube-api-burst=100",
				"--kube-api-capacity-qps=10", "--kube-api-capacity-burst=20", "--capacity-threads=10", "--worker-threads=100"},
			{"raid10-csi-controller", "csi-resizer"}:     {"--kube-api-qps=5", "--kube-api-burst=10"},
			{"raid10-csi-controller", "csi-snapshotter"}: {"--kube-api-qps=5", "--kube-api-burst=10"},
			{"raid10-csi-node", "raid10-csi"}:            {"--kube-api-qps=5", "--kube-api-burst=10"},
		})
	})
	t.Run("Set", func(t *testing.T) {
		objs := renderChart(t, bin, append(api,
			"--set-json", "controller.kubeAPIQPS=7.5", "--set", "controller.kubeAPIBurst=15",
			"--set", "node.kubeAPIQPS=2", "--set", "node.kubeAPIBurst=4",
			"--set", "sidecars.provisioner.kubeAPIQPS=30", "--set", "sidecars.provisioner.kubeAPIBurst=60",
			"--set", "sidecars.provisioner.kubeAPICapacityQPS=3", "--set", "sidecars.provisioner.kubeAPICapacityBurst=6",
			"--set", "sidecars.provisioner.capacityThreads=4", "--set", "sidecars.provisioner.workerThreads=20",
			"--set", "sidecars.resizer.kubeAPIQPS=8", "--set", "sidecars.resizer.kubeAPIBurst=16",
			"--set", "sidecars.snapshotter.kubeAPIQPS=9", "--set", "sidecars.snapshotter.kubeAPIBurst=18")...)
		check(t, objs, want{
			{"raid10-csi-controller", "raid10-csi"}: {"--kube-api-qps=7.5", "--kube-api-burst=15"},
			{"raid10-csi-controller", "csi-provisioner"}: {"--kube-api-qps=30", "--kube-api-burst=60",
				"--kube-api-capacity-qps=3", "--kube-api-capacity-burst=6", "--capacity-threads=4", "--worker-threads=20"},
			{"raid10-csi-controller", "csi-resizer"}:     {"--kube-api-qps=8", "--kube-api-burst=16"},
			{"raid10-csi-controller", "csi-snapshotter"}: {"--kube-api-qps=9", "--kube-api-burst=18"},
			{"raid10-csi-node", "raid10-csi"}:            {"--kube-api-qps=2", "--kube-api-burst=4"},
		})
	})
	for _, tc := range []struct{ set, at string }{
		{"controller.kubeAPIQPS=0", "/controller/kubeAPIQPS"},
		{"controller.kubeAPIBurst=0", "/controller/kubeAPIBurst"},
		{"node.kubeAPIQPS=-1", "/node/kubeAPIQPS"},
		{"sidecars.provisioner.kubeAPICapacityQPS=fast", "/sidecars/provisioner/kubeAPICapacityQPS"},
		{"sidecars.provisioner.capacityThreads=0", "/sidecars/provisioner/capacityThreads"},
		{"sidecars.resizer.kubeAPIBurst=2.5", "/sidecars/resizer/kubeAPIBurst"},
	} {
		t.Run("Refuses "+tc.set, func(t *testing.T) {
			_, stderr, err := helm(t, bin, "template", "raid10-csi", chartDir, "--kube-version", kubeVersion, "--set", tc.set)
			if err == nil || !strings.Contains(stderr, "at '"+tc.at) {
				t.Fatalf("helm template --set %s: %v, want the schema to refuse it at %s:\n%s", tc.set, err, tc.at, stderr)
			}
		})
	}
}

// containerArgs is the args of container name in the Deployment or DaemonSet workload.
func containerArgs(t *testing.T, objs []*unstructured.Unstructured, workload, name string) []string {
	t.Helper()
	for _, o := range objs {
		if o.GetName() != workload || (o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet") {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			if m := c.(map[string]any); m["name"] == name {
				return stringsOf(m["args"])
			}
		}
	}
	t.Fatalf("no container %s in %s", name, workload)
	return nil
}
