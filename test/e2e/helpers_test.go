package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

const (
	// crdDir holds the generated CRDs, as the chart ships them.
	crdDir = "../../charts/raid10-csi/crds"
	// manifest is the chart rendered with its default values (make generate).
	manifest = "../../deploy/raid10-csi.yaml"
	// namespace is the chart's release namespace in deploy/.
	namespace = "raid10-csi"
	// The chart's ServiceAccounts: the controller Deployment (plugin and sidecars) and the
	// node DaemonSet (agent).
	controllerSA = "raid10-csi-controller"
	nodeSA       = "raid10-csi-node"
	// storageClass is the chart's StorageClass.
	storageClass = "raid10"

	// logTailBytes is how much of each log a failed test prints.
	logTailBytes = 8 << 10
)

// skipHeavy skips the end-to-end tests in -short mode and under RAID10_SKIP_HEAVY (make unit).
func skipHeavy(t *testing.T) {
	t.Helper()
	testenv.Heavy(t, "e2e: needs the control plane")
}

// cluster is a running control plane with the chart installed (all but its workloads).
type cluster struct {
	env *kubeenv.Env
	// c is the admin's uncached client (built-in types and v1alpha1).
	c client.Client
}

// startCluster runs the control plane (see kubeenv.Start), installs the chart's CRDs with
// InstallCRDs and creates every other object of deploy/raid10-csi.yaml except the
// Deployment and the DaemonSet (no kubelet runs their pods; the test runs their code):
// namespace, ServiceAccounts, RBAC, CSIDriver, StorageClass.
func startCluster(t *testing.T, opts ...kubeenv.Option) *cluster {
	t.Helper()
	env := kubeenv.Start(t, opts...)
	if names := env.InstallCRDs(t, crdDir); len(names) != 3 {
		t.Fatalf("CRDs in %s: %v, want Raid10Volume, Raid10Node and Raid10Snapshot", crdDir, names)
	}
	// The snapshot API, as a cluster with external-snapshotter serves it (deploy/ has the
	// chart's VolumeSnapshotClass).
	env.InstallCRDs(t, snapshotCRDDir)
	s, err := agent.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	applyManifest(t, env)
	ctx := t.Context()
	waitFor(t, time.Minute, "Raid10Volume served", func() (bool, string) {
		var l v1alpha1.Raid10VolumeList
		err := c.List(ctx, &l)
		return err == nil, fmt.Sprint(err)
	})
	return &cluster{env: env, c: c}
}

// applyManifest creates the objects of deploy/raid10-csi.yaml but its CRDs (installed from
// the chart already), Deployment and DaemonSet, namespace first.
func applyManifest(t *testing.T, env *kubeenv.Env) {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", manifest, err)
		}
		switch u.GetKind() {
		case "", "CustomResourceDefinition", "Deployment", "DaemonSet":
			continue
		case "Namespace":
			objs = append([]*unstructured.Unstructured{u}, objs...)
		default:
			objs = append(objs, u)
		}
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery()))
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		for deadline := time.Now().Add(30 * time.Second); err != nil && time.Now().Before(deadline); {
			// A CRD installed just before may not be in discovery yet.
			time.Sleep(100 * time.Millisecond)
			mapper.Reset()
			m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(t.Context(), o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s from %s: %v", gvk.Kind, o.GetName(), manifest, err)
		}
	}
}

// registerNode creates what a kubelet and the node plugin's registration would: the Node,
// labelled with our topology key, and its CSINode listing raid10.csi.io with that key.
func (cl *cluster) registerNode(t *testing.T, name string) {
	t.Helper()
	ctx := t.Context()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname": name, v1alpha1.TopologyNodeKey: name,
	}}}
	if err := cl.c.Create(ctx, n); err != nil {
		t.Fatalf("create Node %s: %v", name, err)
	}
	cn := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Node", Name: name, UID: n.UID,
		}}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: v1alpha1.DriverName, NodeID: name, TopologyKeys: []string{v1alpha1.TopologyNodeKey},
		}}},
	}
	if err := cl.c.Create(ctx, cn); err != nil {
		t.Fatalf("create CSINode %s: %v", name, err)
	}
}

// getVolume returns the Raid10Volume name, or nil and the error.
func (cl *cluster) getVolume(ctx context.Context, name string) (*v1alpha1.Raid10Volume, error) {
	var v v1alpha1.Raid10Volume
	if err := cl.c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// tableRow fetches one Raid10Volume (or other raid10 resource) as `kubectl get` does, a
// server-side Table, and returns its cells by column name (priority 0 columns only, the
// ones kubectl prints without -o wide), or nil when there is no such object.
func (cl *cluster) tableRow(ctx context.Context, t *testing.T, resource, name string) map[string]any {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cl.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/apis", v1alpha1.GroupName, "v1alpha1", resource).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		Param("fieldSelector", "metadata.name="+name).DoRaw(ctx)
	if err != nil {
		t.Fatalf("get %s %s as Table: %v", resource, name, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatalf("%s Table: %v", resource, err)
	}
	if len(table.Rows) == 0 {
		return nil
	}
	row := map[string]any{}
	for i, col := range table.ColumnDefinitions {
		if col.Priority == 0 && i < len(table.Rows[0].Cells) {
			row[col.Name] = table.Rows[0].Cells[i]
		}
	}
	return row
}

// filePool opens a pool over active sparse files of diskSize bytes and also makes spare
// files (not in the pool, for ReplaceDisk). It returns the pool and every path, the active
// ones first. The pool is closed in t.Cleanup.
func filePool(t *testing.T, active, spare int, diskSize int64, rebuildRate int64) (*pool.Pool, []string) {
	t.Helper()
	dir := t.TempDir()
	var cfg pool.Config
	var paths []string
	for i := range active + spare {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, diskSize); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
		if i < active {
			cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: p})
		}
	}
	cfg.RebuildRateMax = rebuildRate
	pl, err := pool.Open(cfg)
	if err != nil {
		t.Fatalf("open pool on %d files: %v", active, err)
	}
	t.Cleanup(func() {
		if err := pl.Close(); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	return pl, paths
}

// startAgent runs the node agent for node over pl in the test process, as the chart's node
// ServiceAccount with a token bound to a pod on node (as the kubelet projects it: the chart's
// admission policy lets the node ServiceAccount change only the objects of the node its token
// names), until the test ends, and waits until its Raid10Node reports every disk with free
// space.
func (cl *cluster) startAgent(t *testing.T, node string, pl *pool.Pool, disks int) {
	t.Helper()
	cfg := cl.env.NodeServiceAccountConfig(t, namespace, nodeSA, node)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, agent.Options{NodeName: node, Pool: pl}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	})
	d := waitFor(t, time.Minute, "Raid10Node "+node+" reports its disks", func() (bool, string) {
		var n v1alpha1.Raid10Node
		if err := cl.c.Get(t.Context(), client.ObjectKey{Name: node}, &n); err != nil {
			return false, err.Error()
		}
		return n.Status.DiskCount == int32(disks) && n.Status.HealthyDisks == int32(disks) && !n.Status.Capacity.Free.IsZero(),
			fmt.Sprintf("%+v", n.Status)
	})
	t.Logf("agent: Raid10Node %s reported %d disks in %v", node, disks, d.Round(time.Millisecond))
}

// startController serves the CSI controller (identity + controller) on a unix socket in the
// test process, as the chart's controller ServiceAccount, until the test ends. It returns
// the socket's path once it accepts connections.
func (cl *cluster) startController(t *testing.T, readyTimeout time.Duration) string {
	t.Helper()
	// As the plugin builds it (pkg/plugin): a client that can watch (the waits watch their
	// volume) and GetCapacity's informer cache.
	cfg := cl.env.ServiceAccountConfig(t, namespace, controllerSA)
	s, err := agent.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := driver.NewCachedStore(cfg, s)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, err := driver.NewDriver(
		driver.WithMode(driver.ModeController),
		driver.WithEndpoint("unix://"+sock),
		driver.WithVolumeStore(driver.NewKubeStore(c)),
		driver.WithCapacityReads(cs),
		driver.WithVersion("e2e"),
		driver.WithReadyTimeout(readyTimeout),
		driver.WithPollInterval(100*time.Millisecond),
	)
	if err != nil {
		cancel()
		t.Fatalf("driver.NewDriver: %v", err)
	}
	done := make(chan error, 2)
	go func() { done <- d.Run(ctx) }()
	go func() { done <- cs.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("controller: %v", err)
			}
		}
	})
	waitFor(t, 10*time.Second, "controller socket "+sock, func() (bool, string) {
		_, err := os.Stat(sock)
		return err == nil, fmt.Sprint(err)
	})
	return sock
}

// klogToFile sends klog (the in-process controller and agent, controller-runtime through
// klogr) to klog.log in a temporary directory for the rest of the test, and prints its tail
// if the test fails. Call it before starting anything that logs, so that its cleanup runs
// after theirs.
func klogToFile(t *testing.T) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "klog.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// klog's own flags, on a private set: errors too go only to the file.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	set := func(name, value string) {
		if err := fs.Set(name, value); err != nil {
			t.Fatalf("klog flag %s: %v", name, err)
		}
	}
	set("stderrthreshold", "FATAL")
	set("logtostderr", "false")
	klog.SetOutput(f)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(os.Stderr)
		set("logtostderr", "true")
		set("stderrthreshold", "ERROR")
		_ = f.Close()
		if t.Failed() {
			t.Logf("last lines of the controller and agent log (%s):\n%s", path, tail(path))
		}
	})
}

// tail returns the last logTailBytes of the file at path, from a line start.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// waitFor polls cond every 100 ms until it holds or timeout passes, and returns how long
// that took. On timeout the test fails with what and cond's last description of the state.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v; last seen: %s", what, timeout, state)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v", what, t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
