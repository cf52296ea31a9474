package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

const chartDir = "../../charts/raid10-csi"

// kubeVersion is the Kubernetes version helm renders for (a helm built with `go install`
// assumes v1.20, which the chart's kubeVersion refuses): KUBE_VERSION of the tool-version
// table, hack/versions.sh, as hack/render-deploy.sh renders deploy/.
var kubeVersion = hackVersion("KUBE_VERSION")

// hackVersion reads one pin of hack/versions.sh. The table is plain NAME=value lines; a pin
// that is missing panics, since every test of the chart depends on it.
func hackVersion(name string) string {
	data, err := os.ReadFile("../../hack/versions.sh")
	if err != nil {
		panic(fmt.Sprintf("hack/versions.sh: %v", err))
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+"="); ok {
			return v
		}
	}
	panic(fmt.Sprintf("hack/versions.sh: no %s", name))
}

// helmBinary returns the pinned helm of hack/csi-tools.sh, building it when missing (about
// 2 minutes, cached in ~/.cache/raid10-csi). A helm that cannot be had fails the test under
// CI (internal/testenv) and skips it otherwise.
func helmBinary(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", `source hack/csi-tools.sh && csi_tool helm`)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		testenv.Missing(t, "helm (hack/csi-tools.sh): %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// helm runs the pinned helm with its caches and configuration in a scratch directory (no
// user configuration, no repositories), returning stdout and stderr.
func helm(t *testing.T, bin string, args ...string) (string, string, error) {
	t.Helper()
	scratch := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+scratch, "HELM_CONFIG_HOME="+scratch, "HELM_DATA_HOME="+scratch)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// renderChart runs helm template with the values files and --set flags given and decodes
// every object.
func renderChart(t *testing.T, bin string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", "raid10-csi", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, extra...)
	out, stderr, err := helm(t, bin, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return decodeObjects(t, out)
}

func decodeObjects(t *testing.T, data string) []*unstructured.Unstructured {
	t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var u unstructured.Unstructured
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("rendered manifests: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, &u)
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func kindsOf(objs []*unstructured.Unstructured) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.GetKind()+"/"+o.GetName())
	}
	slices.Sort(ks)
	return ks
}

// poolConfig decodes the pool.json of the rendered ConfigMap as the node plugin does
// (pool.LoadConfig) and checks it with pool.Config.Validate.
func poolConfig(t *testing.T, objs []*unstructured.Unstructured) pool.Config {
	t.Helper()
	cm := find(objs, "ConfigMap", "raid10-csi-pool")
	if cm == nil {
		t.Fatalf("no ConfigMap raid10-csi-pool in %v", kindsOf(objs))
	}
	data, _, _ := unstructured.NestedString(cm.Object, "data", "pool.json")
	path := filepath.Join(t.TempDir(), "pool.json")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := pool.LoadConfig(path)
	if err != nil {
		t.Fatalf("pool.json:\n%s\n%v", data, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("pool.json does not validate: %v\n%s", err, data)
	}
	return cfg
}

// nodeContainer is the raid10-csi container of the node DaemonSet.
func nodeContainer(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	ds := find(objs, "DaemonSet", "raid10-csi-node")
	if ds == nil {
		t.Fatalf("no DaemonSet raid10-csi-node in %v", kindsOf(objs))
	}
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	for _, c := range cs {
		if m := c.(map[string]any); m["name"] == "raid10-csi" {
			return m
		}
	}
	t.Fatal("no raid10-csi container in the node DaemonSet")
	return nil
}

func stringsOf(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestHelmLint runs helm lint --strict (a warning fails) on the chart with its defaults and
// with a disk list, the value set that exercises most of the templates.
func TestHelmLint(t *testing.T) {
	bin := helmBinary(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"Defaults", nil},
		{"Disks", []string{"--set", "node.pool.disks[0].path=/dev/disk/by-id/nvme-A", "--set", "storageClass.isDefault=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"lint", "--strict", "--kube-version", kubeVersion, chartDir}, tc.args...)
			out, stderr, err := helm(t, bin, args...)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
			// [INFO] lines (icon is recommended) are advice; anything louder is a finding.
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "[WARNING]") || strings.Contains(l, "[ERROR]") {
					t.Errorf("helm lint: %s", l)
				}
			}
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Fatalf("helm lint output:\n%s", out)
			}
		})
	}
}

// TestHelmTemplate renders the chart with a few value sets and checks the manifests the
// install relies on: the defaults are deploy/ (no disk claimed), a custom StorageClass, an
// explicit block of disks in the pool ConfigMap the node plugin reads, and the parts that
// can be switched off.
func TestHelmTemplate(t *testing.T) {
	bin := helmBinary(t)

	t.Run("DefaultsAreDeploy", func(t *testing.T) {
		objs := renderChart(t, bin, "--include-crds", "--api-versions", "snapshot.storage.k8s.io/v1/VolumeSnapshotClass")
		deployed := readObjects(t)
		var want []*unstructured.Unstructured
		for _, o := range deployed {
			if o.GetKind() != "Namespace" { // render-deploy adds the Namespace
				want = append(want, o)
			}
		}
		if got, w := kindsOf(objs), kindsOf(want); !slices.Equal(got, w) {
			t.Fatalf("helm template with defaults:\n%v\ndeploy/raid10-csi.yaml:\n%v\n(run hack/render-deploy.sh)", got, w)
		}
		for _, o := range objs {
			d := find(want, o.GetKind(), o.GetName())
			a, _ := json.Marshal(o.Object)
			b, _ := json.Marshal(d.Object)
			if !bytes.Equal(a, b) {
				t.Errorf("%s %s differs from deploy/raid10-csi.yaml (run hack/render-deploy.sh)", o.GetKind(), o.GetName())
			}
		}
		cfg := poolConfig(t, objs)
		if len(cfg.Disks) != 0 || cfg.Name != "default" {
			t.Fatalf("default pool: %+v, want no disk at all", cfg)
		}
		args := stringsOf(nodeContainer(t, objs)["args"])
		for _, want := range []string{"--mode=node", "--pool-config=/etc/raid10-csi/pool.json", "--state-dir=/var/lib/raid10-csi", "--member-timeout=5s"} {
			if !slices.Contains(args, want) {
				t.Errorf("node args %v lack %s", args, want)
			}
		}
		checkNodePod(t, objs, true)
		checkTerminationMessages(t, objs)
		sc := find(objs, "StorageClass", "raid10")
		params, _, _ := unstructured.NestedStringMap(sc.Object, "parameters")
		if params["members"] != "4" || params["chunkSize"] != "512Ki" || params["csi.storage.k8s.io/fstype"] != "ext4" {
			t.Errorf("default StorageClass parameters: %v", params)
		}
		if ann := sc.GetAnnotations(); ann["storageclass.kubernetes.io/is-default-class"] != "" {
			t.Errorf("the StorageClass is the default one without isDefault: %v", ann)
		}
	})

	t.Run("OwnNetlinkNamespace", func(t *testing.T) {
		checkNodePod(t, renderChart(t, bin, "--set", "node.netlinkNetNS="), false)
	})

	t.Run("CustomStorageClass", func(t *testing.T) {
		objs := renderChart(t, bin,
			"--set", "storageClass.name=raid10-fast",
			"--set", "storageClass.isDefault=true",
			"--set", "storageClass.reclaimPolicy=Retain",
			"--set", "storageClass.fsType=xfs",
			"--set-string", "storageClass.parameters.members=2",
			"--set", "storageClass.parameters.chunkSize=64Ki")
		sc := find(objs, "StorageClass", "raid10-fast")
		if sc == nil || find(objs, "StorageClass", "raid10") != nil {
			t.Fatalf("StorageClasses: %v", kindsOf(objs))
		}
		params, _, _ := unstructured.NestedStringMap(sc.Object, "parameters")
		want := map[string]string{"members": "2", "chunkSize": "64Ki", "csi.storage.k8s.io/fstype": "xfs"}
		if !equalMaps(params, want) {
			t.Errorf("parameters %v, want %v", params, want)
		}
		if p, _, _ := unstructured.NestedString(sc.Object, "reclaimPolicy"); p != "Retain" {
			t.Errorf("reclaimPolicy %q", p)
		}
		if p, _, _ := unstructured.NestedString(sc.Object, "volumeBindingMode"); p != "WaitForFirstConsumer" {
			t.Errorf("volumeBindingMode %q", p)
		}
		if sc.GetAnnotations()["storageclass.kubernetes.io/is-default-class"] != "true" {
			t.Errorf("isDefault not set: %v", sc.GetAnnotations())
		}
		// The provisioner's default fsType follows the StorageClass's.
		dep := find(objs, "Deployment", "raid10-csi-controller")
		if dep == nil || !strings.Contains(mustJSON(t, dep.Object), "--default-fstype=xfs") {
			t.Error("csi-provisioner does not get --default-fstype=xfs")
		}
	})

	t.Run("Disks", func(t *testing.T) {
		values := filepath.Join(t.TempDir(), "disks.yaml")
		if err := os.WriteFile(values, []byte(`
node:
  stateDir: /var/lib/raid10
  pool:
    name: fast
    rebuildRateMax: 209715200
    allocation: best-fit
    disks:
      - path: /dev/disk/by-id/nvme-Vendor_Model_S1
      - path: /dev/disk/by-id/nvme-Vendor_Model_S2
      - path: /dev/disk/by-id/nvme-Vendor_Model_S3
        wipe: true
      - path: /dev/disk/by-id/nvme-Vendor_Spare_*
        spare: true
`), 0o600); err != nil {
			t.Fatal(err)
		}
		objs := renderChart(t, bin, "-f", values)
		cfg := poolConfig(t, objs)
		want := []pool.DiskConfig{
			{Path: "/dev/disk/by-id/nvme-Vendor_Model_S1"},
			{Path: "/dev/disk/by-id/nvme-Vendor_Model_S2"},
			{Path: "/dev/disk/by-id/nvme-Vendor_Model_S3", Wipe: true},
			{Path: "/dev/disk/by-id/nvme-Vendor_Spare_*", Spare: true},
		}
		if !slices.Equal(cfg.Disks, want) || cfg.Name != "fast" || cfg.RebuildRateMax != 200<<20 || cfg.Allocation != pool.BestFit {
			t.Fatalf("pool.json: %+v", cfg)
		}
		c := nodeContainer(t, objs)
		args := stringsOf(c["args"])
		if !slices.Contains(args, "--state-dir=/var/lib/raid10") || !slices.Contains(args, "--pool-config=/etc/raid10-csi/pool.json") {
			t.Errorf("node args: %v", args)
		}
		if !strings.Contains(mustJSON(t, c["volumeMounts"]), `"mountPath":"/etc/raid10-csi","name":"pool-config","readOnly":true`) {
			t.Errorf("pool-config not mounted: %s", mustJSON(t, c["volumeMounts"]))
		}
		// Another disk list is another pod template: the DaemonSet rolls.
		def := renderChart(t, bin)
		ann := func(objs []*unstructured.Unstructured) string {
			a, _, _ := unstructured.NestedString(find(objs, "DaemonSet", "raid10-csi-node").Object,
				"spec", "template", "metadata", "annotations", "raid10.csi.io/pool-config-sha256")
			return a
		}
		if a, b := ann(objs), ann(def); a == "" || a == b {
			t.Errorf("pool-config checksum annotation %q, defaults %q", a, b)
		}
	})

	t.Run("MemberTimeout", func(t *testing.T) {
		args := stringsOf(nodeContainer(t, renderChart(t, bin, "--set", "node.memberTimeout=1500ms"))["args"])
		if !slices.Contains(args, "--member-timeout=1500ms") {
			t.Errorf("node args %v lack --member-timeout=1500ms", args)
		}
		for _, a := range stringsOf(nodeContainer(t, renderChart(t, bin, "--set", "node.memberTimeout="))["args"]) {
			if strings.HasPrefix(a, "--member-timeout") {
				t.Errorf("an empty node.memberTimeout renders %s; want the plugin's default", a)
			}
		}
	})

	t.Run("Snapshots", func(t *testing.T) {
		containers := func(objs []*unstructured.Unstructured) []string {
			var names []string
			cs, _, _ := unstructured.NestedSlice(find(objs, "Deployment", "raid10-csi-controller").Object, "spec", "template", "spec", "containers")
			for _, c := range cs {
				names = append(names, c.(map[string]any)["name"].(string))
			}
			return names
		}
		// Without the snapshot API on the cluster: the sidecar, but no VolumeSnapshotClass
		// (it would fail the install), no CRDs, no snapshot-controller.
		snapshotCRDs := func(objs []*unstructured.Unstructured) []string {
			var crds []string
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" && strings.HasSuffix(o.GetName(), ".snapshot.storage.k8s.io") {
					crds = append(crds, o.GetName())
				}
			}
			slices.Sort(crds)
			return crds
		}
		plain := renderChart(t, bin, "--include-crds")
		if !slices.Contains(containers(plain), "csi-snapshotter") || find(plain, "ClusterRole", "raid10-csi-snapshotter") == nil {
			t.Errorf("defaults: controller containers %v, want csi-snapshotter and its ClusterRole", containers(plain))
		}
		for _, o := range plain {
			if o.GetKind() == "VolumeSnapshotClass" {
				t.Errorf("defaults on a cluster without the snapshot API: VolumeSnapshotClass %s rendered", o.GetName())
			}
		}
		if crds := snapshotCRDs(plain); len(crds) > 0 {
			t.Errorf("defaults: snapshot CRDs %v rendered, want none (installCRDs is off)", crds)
		}
		if find(plain, "Deployment", "raid10-csi-snapshot-controller") != nil {
			t.Error("snapshot-controller rendered although off by default")
		}
		// installCRDs and the controller: the three CRDs (the snapshot-crds subchart's crds/,
		// which helm install creates before it renders; TestHelmInstallSnapshotCRDs installs
		// them for real), the class where the API is served, the controller.
		all := renderChart(t, bin, "--include-crds", "--set", "snapshots.installCRDs=true", "--set", "snapshots.controller.enabled=true",
			"--api-versions", "snapshot.storage.k8s.io/v1/VolumeSnapshotClass")
		if crds, want := snapshotCRDs(all), []string{"volumesnapshotclasses.snapshot.storage.k8s.io", "volumesnapshotcontents.snapshot.storage.k8s.io", "volumesnapshots.snapshot.storage.k8s.io"}; !slices.Equal(crds, want) {
			t.Errorf("installCRDs: CRDs %v, want %v", crds, want)
		}
		if vsc := find(all, "VolumeSnapshotClass", "raid10"); vsc == nil || vsc.Object["driver"] != "raid10.csi.io" || vsc.Object["deletionPolicy"] != "Delete" {
			t.Errorf("VolumeSnapshotClass raid10: %v", vsc)
		}
		if find(all, "Deployment", "raid10-csi-snapshot-controller") == nil || find(all, "ClusterRole", "raid10-csi-snapshot-controller") == nil {
			t.Errorf("controller.enabled: no snapshot-controller Deployment or ClusterRole: %v", kindsOf(all))
		}
		// Off: no sidecar, no snapshotter RBAC, no class.
		off := renderChart(t, bin, "--set", "snapshots.enabled=false", "--api-versions", "snapshot.storage.k8s.io/v1/VolumeSnapshotClass")
		if slices.Contains(containers(off), "csi-snapshotter") || find(off, "ClusterRole", "raid10-csi-snapshotter") != nil || find(off, "VolumeSnapshotClass", "raid10") != nil {
			t.Errorf("snapshots.enabled=false: containers %v, kinds %v", containers(off), kindsOf(off))
		}
	})

	t.Run("PartsOff", func(t *testing.T) {
		objs := renderChart(t, bin, "--set", "node.enabled=false", "--set", "storageClass.create=false")
		for _, o := range objs {
			if o.GetKind() == "DaemonSet" || o.GetKind() == "ConfigMap" || o.GetKind() == "StorageClass" {
				t.Errorf("%s %s rendered although switched off", o.GetKind(), o.GetName())
			}
		}
		if find(objs, "Deployment", "raid10-csi-controller") == nil || find(objs, "CSIDriver", "raid10.csi.io") == nil {
			t.Errorf("controller or CSIDriver missing: %v", kindsOf(objs))
		}
	})
}

// TestHelmSchemaRefusesBadValues: every value below breaks values.schema.json, so helm
// template fails and names the value.
func TestHelmSchemaRefusesBadValues(t *testing.T) {
	bin := helmBinary(t)
	for _, tc := range []struct {
		name string
		set  []string
		want string // the schema location helm reports
	}{
		{"RelativeDiskPath", []string{"--set", "node.pool.disks[0].path=nvme0n1"}, "/node/pool/disks/0/path"},
		{"UnknownDiskKey", []string{"--set", "node.pool.disks[0].path=/dev/sdb", "--set", "node.pool.disks[0].format=true"}, "/node/pool/disks/0"},
		{"WipeNotBool", []string{"--set", "node.pool.disks[0].path=/dev/sdb", "--set-string", "node.pool.disks[0].wipe=yes"}, "/node/pool/disks/0/wipe"},
		{"FsType", []string{"--set", "storageClass.fsType=btrfs"}, "/storageClass/fsType"},
		{"OddMembers", []string{"--set-string", "storageClass.parameters.members=3"}, "/storageClass/parameters/members"},
		{"UnknownParameter", []string{"--set", "storageClass.parameters.raidLevel=5"}, "/storageClass/parameters"},
		{"ChunkSize", []string{"--set", "storageClass.parameters.chunkSize=3Ki"}, "/storageClass/parameters/chunkSize"},
		{"ReclaimPolicy", []string{"--set", "storageClass.reclaimPolicy=Recycle"}, "/storageClass/reclaimPolicy"},
		{"LogLevel", []string{"--set-string", "logLevel=high"}, "/logLevel"},
		{"Replicas", []string{"--set", "controller.replicas=0"}, "/controller/replicas"},
		{"Allocation", []string{"--set", "node.pool.allocation=random"}, "/node/pool/allocation"},
		{"Timeout", []string{"--set", "sidecars.provisioner.timeout=2 minutes"}, "/sidecars/provisioner/timeout"},
		{"MemberTimeout", []string{"--set", "node.memberTimeout=soon"}, "/node/memberTimeout"},
		{"RelativeNetlinkNetNS", []string{"--set", "node.netlinkNetNS=proc/1/ns/net"}, "/node/netlinkNetNS"},
		{"RegistrarIsGone", []string{"--set", "sidecars.registrar.image=x"}, "/sidecars"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "raid10-csi", chartDir, "--kube-version", kubeVersion}, tc.set...)
			_, stderr, err := helm(t, bin, args...)
			if err == nil {
				t.Fatalf("helm template %v succeeded; the schema should refuse it", tc.set)
			}
			if !strings.Contains(stderr, "at '"+tc.want) {
				t.Fatalf("helm template %v: error does not name %s:\n%s", tc.set, tc.want, stderr)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkNodePod: the node plugin registers itself with the kubelet (the plugins_registry
// directory mounted, the CSI socket's host path reported, no registrar sidecar) and, with
// hostNetNS, opens its nbd netlink socket in the host's network namespace through hostPID
// (never hostNetwork); without it, neither.
func checkNodePod(t *testing.T, objs []*unstructured.Unstructured, hostNetNS bool) {
	t.Helper()
	c := nodeContainer(t, objs)
	args := stringsOf(c["args"])
	for _, want := range []string{"--registration-dir=/registration", "--kubelet-registration-path=/var/lib/kubelet/plugins/raid10.csi.io/csi.sock"} {
		if !slices.Contains(args, want) {
			t.Errorf("node args %v lack %s", args, want)
		}
	}
	if got := slices.Contains(args, "--netlink-netns=/proc/1/ns/net"); got != hostNetNS {
		t.Errorf("node args %v: --netlink-netns=/proc/1/ns/net present %v, want %v", args, got, hostNetNS)
	}
	ds := find(objs, "DaemonSet", "raid10-csi-node")
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	if spec["hostPID"] != hostNetNS || spec["hostNetwork"] == true {
		t.Errorf("node pod hostPID %v (want %v), hostNetwork %v (want false)", spec["hostPID"], hostNetNS, spec["hostNetwork"])
	}
	// A surge update: the new pod starts and becomes Ready beside the old one, which hands
	// its devices over when the DaemonSet deletes it. Two pods on a node need ports of their
	// own: their own network (above) and no hostPort.
	strategy, _, _ := unstructured.NestedMap(ds.Object, "spec", "updateStrategy")
	if got := mustJSON(t, strategy); got != `{"rollingUpdate":{"maxSurge":1,"maxUnavailable":0},"type":"RollingUpdate"}` {
		t.Errorf("node DaemonSet updateStrategy %s; want a surge of 1 with none unavailable", got)
	}
	for _, p := range c["ports"].([]any) {
		if hp, ok := p.(map[string]any)["hostPort"]; ok {
			t.Errorf("node container port %v has hostPort %v: a surge pod could not start beside the old one", p, hp)
		}
	}
	mounted := false
	for _, m := range c["volumeMounts"].([]any) {
		if mm := m.(map[string]any); mm["name"] == "registration-dir" && mm["mountPath"] == "/registration" {
			mounted = true
		}
	}
	vols, _, _ := unstructured.NestedSlice(spec, "volumes")
	host := ""
	for _, v := range vols {
		if vm := v.(map[string]any); vm["name"] == "registration-dir" {
			host, _, _ = unstructured.NestedString(vm, "hostPath", "path")
		}
	}
	if !mounted || host != "/var/lib/kubelet/plugins_registry" {
		t.Errorf("registration directory: mounted %v, host path %q; want /var/lib/kubelet/plugins_registry at /registration", mounted, host)
	}
	cs, _, _ := unstructured.NestedSlice(spec, "containers")
	for _, c := range cs {
		if name := c.(map[string]any)["name"]; name == "node-driver-registrar" {
			t.Errorf("the node pod still runs %s", name)
		}
	}
}

// checkTerminationMessages: the plugin's and the holder's containers keep their log's end in
// their status when they exit with an error (FallbackToLogsOnError), where kubectl describe
// shows it after the log file is gone or rotated.
func checkTerminationMessages(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, w := range []struct{ kind, name, container string }{
		{"DaemonSet", "raid10-csi-node", "raid10-csi"},
		{"DaemonSet", "raid10-csi-holder", "holder"},
		{"Deployment", "raid10-csi-controller", "raid10-csi"},
	} {
		o := find(objs, w.kind, w.name)
		if o == nil {
			t.Errorf("no %s %s", w.kind, w.name)
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		found := false
		for _, c := range cs {
			m, _ := c.(map[string]any)
			if m["name"] != w.container {
				continue
			}
			found = true
			if p := m["terminationMessagePolicy"]; p != "FallbackToLogsOnError" {
				t.Errorf("%s %s container %s: terminationMessagePolicy %v, want FallbackToLogsOnError", w.kind, w.name, w.container, p)
			}
		}
		if !found {
			t.Errorf("%s %s has no container %s", w.kind, w.name, w.container)
		}
	}
}
