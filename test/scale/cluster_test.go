package scale

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

const (
	crdDir = "../../charts/raid10-csi/crds"
	// namespace holds the provisioner's CSIStorageCapacity objects and its lease.
	namespace = "raid10-csi"
	// class is the StorageClass of the claims: WaitForFirstConsumer, four members, as the
	// chart's.
	class = "raid10-scale"
	// classImmediate is the same with Immediate binding: the claims' Immediate half makes it
	// and deletes it after (csi-provisioner publishes capacity per class: it would double
	// the CSIStorageCapacity objects of every other measurement).
	classImmediate = "raid10-scale-immediate"
	// provisionerEnv names the csi-provisioner binary (hack/tool-env.sh).
	provisionerEnv = "RAID10_CSI_PROVISIONER"
)

// cluster is the control plane, the in-process controller plugin on a unix socket, the
// real csi-provisioner publishing CSIStorageCapacity, and the hollow nodes started so far.
type cluster struct {
	env         *kubeenv.Env
	ctrl        *exec.Cmd     // the controller plugin's process; nil when it runs in this one
	ctrlMetrics string        // the controller plugin's metrics URL (Go heap), with ctrl
	c           client.Client // admin, uncached; it can watch (the in-process controller's waits)
	agentCfg    *rest.Config  // the hollow agents' client configuration
	csi         csi.ControllerClient
	nodes       []*Node
	sched       kubeenv.SchedulerConfig // kube-scheduler's, with claimsPlane
}

// storageClass is a StorageClass of the driver's with four members, reclaim policy Delete
// and the binding mode given: class's and classImmediate's.
func storageClass(name string, binding storagev1.VolumeBindingMode) *storagev1.StorageClass {
	del := corev1.PersistentVolumeReclaimDelete
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: v1alpha1.DriverName,
		Parameters: map[string]string{driver.ParamMembers: "4"}, VolumeBindingMode: &binding, ReclaimPolicy: &del}
}

// startCluster starts etcd and kube-apiserver, the CRDs, a CSIDriver with storage capacity,
// the StorageClass, the controller plugin (ModeController over a KubeStore, as the chart's
// Deployment runs it) and csi-provisioner with capacity tracking polling every capPoll.
func startCluster(t *testing.T, capPoll time.Duration) *cluster {
	return startClusterWith(t, capPoll, "", limits{})
}

// startClusterWith is startCluster with the controller plugin run as the binary plugin
// (cmd/raid10-csi, --mode=controller, with its own client settings, as the chart runs it)
// when plugin is not "", else in this process; the plugin binary, csi-provisioner and the
// hollow agents get lim's client settings; opts add to the control plane (claimsPlane).
func startClusterWith(t *testing.T, capPoll time.Duration, plugin string, lim limits, opts ...kubeenv.Option) *cluster {
	t.Helper()
	testenv.Heavy(t, "scale: needs the control plane")
	prov := os.Getenv(provisionerEnv)
	if _, err := os.Stat(prov); prov == "" || err != nil {
		testenv.Missing(t, "scale: csi-provisioner unavailable ($%s=%q); run `make deps` and `source hack/tool-env.sh`", provisionerEnv, prov)
	}
	klogToFile(t)
	// controller-runtime (the client, the agents' managers) logs through klog.
	ctrllog.SetLogger(klog.NewKlogr())
	env := kubeenv.Start(t, opts...)
	env.InstallCRDs(t, crdDir)
	s, err := agent.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	yes := true
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DriverName}, Spec: storagev1.CSIDriverSpec{
			AttachRequired: new(bool), StorageCapacity: &yes,
		}},
		storageClass(class, storagev1.VolumeBindingWaitForFirstConsumer),
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	waitFor(t, time.Minute, "Raid10Volume served", func() (bool, string) {
		err := c.List(ctx, &v1alpha1.Raid10VolumeList{})
		return err == nil, fmt.Sprint(err)
	})
	cl := &cluster{env: env, c: c, agentCfg: rest.CopyConfig(env.Config)}
	if lim.agentQPS > 0 {
		cl.agentCfg.QPS, cl.agentCfg.Burst = lim.agentQPS, lim.agentBurst
	}
	var sock string
	if plugin == "" {
		sock = cl.startController(t)
	} else {
		sock = cl.startPlugin(t, plugin, lim.plugin)
	}
	kubeconfig := env.Kubeconfig
	startSidecar(t, "csi-provisioner", prov, []string{"NAMESPACE=" + namespace, "POD_NAME=raid10-csi-controller-scale"},
		append([]string{"--csi-address=" + sock, "--kubeconfig=" + kubeconfig, "--timeout=60s", "--feature-gates=Topology=true",
			"--enable-capacity=true", "--capacity-ownerref-level=-1", "--capacity-poll-interval=" + capPoll.String(),
			"--extra-create-metadata=true", "--default-fstype=ext4", "--node-deployment=false", "--leader-election=false",
			"--v=2"}, lim.provisioner...)...)
	return cl
}

// startController serves the controller plugin on a unix socket until the test ends and
// connects cl.csi to it.
func (cl *cluster) startController(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, err := driver.NewDriver(driver.WithMode(driver.ModeController), driver.WithEndpoint("unix://"+sock),
		driver.WithVolumeStore(driver.NewKubeStore(cl.c)), driver.WithVersion("scale"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	waitFor(t, 10*time.Second, "controller socket", func() (bool, string) {
		_, err := os.Stat(sock)
		return err == nil, fmt.Sprint(err)
	})
	cl.dial(t, sock)
	return sock
}

// startPlugin runs the controller plugin binary on a unix socket, with the extra flags,
// until the test ends and connects cl.csi to it.
func (cl *cluster) startPlugin(t *testing.T, bin string, extra []string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	addr := freeAddr(t)
	cl.ctrlMetrics = "http://" + addr + "/metrics"
	cl.ctrl = startSidecar(t, "raid10-csi-controller", bin, nil, append([]string{"--mode=controller", "--endpoint=unix://" + sock,
		"--kubeconfig=" + cl.env.Kubeconfig, "--metrics-address=" + addr, "--v=1"}, extra...)...)
	waitFor(t, 30*time.Second, "controller socket", func() (bool, string) {
		_, err := os.Stat(sock)
		return err == nil, fmt.Sprint(err)
	})
	cl.dial(t, sock)
	return sock
}

// dial connects cl.csi to the controller's socket.
func (cl *cluster) dial(t *testing.T, sock string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	cl.csi = csi.NewControllerClient(conn)
}

// addNodes starts n more hollow nodes, named node-<i>, eight at a time, and stops them
// when the test ends.
func (cl *cluster) addNodes(t *testing.T, n int) []*Node {
	t.Helper()
	first := len(cl.nodes)
	added := make([]*Node, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			added[i], errs[i] = StartNode(t.Context(), cl.agentCfg, cl.c, NodeConfig{Name: fmt.Sprintf("node-%04d", first+i)})
		}()
	}
	wg.Wait()
	for _, nd := range added {
		if nd != nil {
			t.Cleanup(func() {
				if err := nd.Stop(); err != nil {
					t.Errorf("stop %s: %v", nd.Name, err)
				}
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	cl.nodes = append(cl.nodes, added...)
	return added
}

// reported waits until every node of nodes has its disks in its Raid10Node and a
// CSIStorageCapacity above zero for the class, and returns, per node, how long after its
// start (Node.Started) each was first seen. One list of each kind per round.
func (cl *cluster) reported(t *testing.T, nodes []*Node, timeout time.Duration) (toNode, toCap []time.Duration) {
	t.Helper()
	ctx := t.Context()
	nodeAt, capAt := map[string]time.Time{}, map[string]time.Time{}
	waitFor(t, timeout, "Raid10Node and CSIStorageCapacity of every node", func() (bool, string) {
		var rn v1alpha1.Raid10NodeList
		var sc storagev1.CSIStorageCapacityList
		if err := cl.c.List(ctx, &rn); err != nil {
			return false, err.Error()
		}
		if err := cl.c.List(ctx, &sc, client.InNamespace(namespace)); err != nil {
			return false, err.Error()
		}
		now := time.Now()
		for _, n := range rn.Items {
			if _, ok := nodeAt[n.Name]; !ok && n.Status.HealthyDisks == 4 && !n.Status.Capacity.Free.IsZero() {
				nodeAt[n.Name] = now
			}
		}
		for _, c := range sc.Items {
			if c.StorageClassName != class || c.NodeTopology == nil || c.Capacity == nil || c.Capacity.IsZero() {
				continue
			}
			if name := c.NodeTopology.MatchLabels[v1alpha1.TopologyNodeKey]; name != "" {
				if _, ok := capAt[name]; !ok {
					capAt[name] = now
				}
			}
		}
		missing := 0
		for _, nd := range nodes {
			if _, ok := nodeAt[nd.Name]; !ok {
				missing++
			} else if _, ok := capAt[nd.Name]; !ok {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d nodes without Raid10Node disks or CSIStorageCapacity", missing, len(nodes))
	})
	for _, nd := range nodes {
		toNode, toCap = append(toNode, nodeAt[nd.Name].Sub(nd.Started)), append(toCap, capAt[nd.Name].Sub(nd.Started))
	}
	return toNode, toCap
}

// createVolume is the provisioner's CreateVolume of a claim of size bytes on node.
// It returns the volume's ID.
func (cl *cluster) createVolume(ctx context.Context, name, node string, size int64) (string, error) {
	top := []*csi.Topology{{Segments: map[string]string{v1alpha1.TopologyNodeKey: node}}}
	resp, err := cl.csi.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Parameters:                map[string]string{driver.ParamMembers: "4"},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: top, Preferred: top},
	})
	return resp.GetVolume().GetVolumeId(), err
}

// apiRequests is the kube-apiserver's own count of the requests it served
// (apiserver_request_total), in all and by "VERB resource".
func (cl *cluster) apiRequests(t *testing.T) (float64, map[string]float64) {
	t.Helper()
	raw, err := cl.env.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("kube-apiserver /metrics: %v", err)
	}
	by := map[string]float64{}
	var total float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		total += v
		by[label(line, "verb")+" "+label(line, "resource")] += v
	}
	return total, by
}

// label is the value of label name in a Prometheus text line.
func label(line, name string) string {
	_, rest, ok := strings.Cut(line, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// waitFor polls cond every 100 ms until it holds or timeout passes, and returns how long
// that took; on timeout the test fails with what and cond's last word on the state.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	return waitEvery(t, 100*time.Millisecond, timeout, what, cond)
}

// waitEvery is waitFor polling every interval (lists of many objects: the claims').
func waitEvery(t *testing.T, interval, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
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
		case <-time.After(interval):
		}
	}
}

// startSidecar runs bin with args in its own process group (KUBECONFIG dropped from the
// environment, env added) and stops it when the test ends: SIGTERM, SIGKILL after 10 s.
func startSidecar(t *testing.T, name, bin string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBECONFIG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = f.Close(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("end of %s's log:\n%s", name, b[max(0, len(b)-8192):])
		}
	})
	return cmd
}

// klogToFile sends klog (controller, agents, controller-runtime) to a file for the rest of
// the test and prints its tail when the test failed.
func klogToFile(t *testing.T) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "klog.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("stderrthreshold", "FATAL")
	_ = fs.Set("logtostderr", "false")
	klog.SetOutput(f)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(os.Stderr)
		_ = fs.Set("logtostderr", "true")
		_ = fs.Set("stderrthreshold", "ERROR")
		_ = f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(path)
			t.Logf("end of the klog log:\n%s", b[max(0, len(b)-8192):])
		}
	})
}

// deleteRequest is the provisioner's DeleteVolume of volume id.
func deleteRequest(id string) *csi.DeleteVolumeRequest {
	return &csi.DeleteVolumeRequest{VolumeId: id}
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// metricValue reads one unlabelled metric from a Prometheus text endpoint; 0 when absent.
func metricValue(url, name string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}
