package k8se2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raid10-csi/raid10-csi/test/cluster"
)

// The variables `make k8s-e2e` passes (FOCUS, SKIP, PARALLEL, REPORT).
const (
	runEnv      = "RAID10_K8S_E2E_RUN"      // set: run TestK8sE2E
	focusEnv    = "RAID10_K8S_E2E_FOCUS"    // --ginkgo.focus
	skipEnv     = "RAID10_K8S_E2E_SKIP"     // --ginkgo.skip
	parallelEnv = "RAID10_K8S_E2E_PARALLEL" // ginkgo processes (1: the binary alone)
	reportEnv   = "RAID10_K8S_E2E_REPORT"   // directory for the JUnit report and the log
)

const (
	namespace = "raid10-csi"
	release   = "raid10-csi"
	// pauseImage is hack/image.sh's pause image (containerd's sandbox_image on the rig).
	pauseImage = "docker.io/raid10-csi/pause:0.1.0"
	// diskSize: the suites' claims are 512Mi (driver.yaml) and grow by 1Gi in volume-expand,
	// mirrored on 4 disks; several specs' volumes live at once.
	diskSize = 8 << 30
)

// TestK8sE2E runs Kubernetes' external storage suites (e2e.test, driver.yaml) against the
// chart on the test/cluster rig: images, one node booted with them, helm install with the
// chart's defaults but what the rig needs (its disks, its sidecar images, one controller
// replica on one node) and the snapshot CRDs and snapshot-controller that the chart can
// install, then e2e.test with the KUBE_TEST_REPO_LIST of images.go.
func TestK8sE2E(t *testing.T) {
	if os.Getenv(runEnv) == "" {
		t.Skipf("%s not set: run `make k8s-e2e` (FOCUS, SKIP, PARALLEL)", runEnv)
	}
	bin := e2eBinary(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	report := os.Getenv(reportEnv)
	if report == "" {
		report = filepath.Join(root, "_output", "k8s-e2e")
	}
	if err := os.MkdirAll(report, 0o755); err != nil {
		t.Fatal(err)
	}
	helm := tool(t, root, `source hack/csi-tools.sh && csi_tool helm`)
	images, sidecars := buildImages(t, root, filepath.Dir(bin))

	ctx := context.Background()
	r := cluster.New(t, cluster.Config{NVMe: 4, DiskSize: diskSize, StateSize: 4 << 30,
		Images: images, SandboxImage: pauseImage, Memory: 4096})
	r.Boot(ctx)
	var disks []string
	for i := range 4 {
		disks = append(disks, fmt.Sprintf(`{"path":%q}`, r.ByID(i)))
	}
	args := []string{"install", release, filepath.Join(root, "charts/raid10-csi"),
		"--namespace", namespace, "--create-namespace", "--kubeconfig", r.Env.Kubeconfig,
		"--set-json", "node.pool.disks=[" + strings.Join(disks, ",") + "]",
		"--set", "controller.replicas=1", "--set", "snapshots.controller.enabled=true",
		"--set", "snapshots.controller.replicas=1",
		// driver.yaml's VolumeAttributesClass, for the volume-modify suite.
		"--set-json", `volumeAttributesClasses=[{"name":"raid10-e2e","parameters":{"maxReadIOPS":"2000","maxWriteIOPS":"1000"}}]`,
		"--wait", "--timeout", "20m"}
	for key, img := range sidecars {
		args = append(args, "--set", "sidecars."+key+".image="+img)
	}
	// The chart installs the snapshot CRDs itself (snapshots.installCRDs: its snapshot-crds
	// subchart's crds/, which helm creates before it renders the VolumeSnapshotClass).
	start := time.Now()
	run(t, helm, append(args, "--set", "snapshots.installCRDs=true")...)
	t.Logf("chart installed and Ready in %v", time.Since(start).Round(time.Second))
	// The scheduler places a WaitForFirstConsumer claim's pod only where a CSIStorageCapacity
	// says the class fits: the suites' first claims came before csi-provisioner had published
	// the node's, and their pods waited unscheduled (docs/install.md, "First run").
	waitCapacity(ctx, t, r, 10*time.Minute)
	t.Logf("the node's capacity published %v after the install", time.Since(start).Round(time.Second))

	list := filepath.Join(report, "repo-list.yaml")
	if err := os.WriteFile(list, []byte(repoList()), 0o644); err != nil {
		t.Fatal(err)
	}
	e2e := e2eCommand(bin, r.Env.Kubeconfig, report)
	e2e.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+list)
	logf, err := os.Create(filepath.Join(report, "e2e.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logf.Close() }()
	e2e.Stdout, e2e.Stderr = logf, logf
	t.Logf("running %v (log: %s)", e2e.Args, logf.Name())
	start = time.Now()
	err = e2e.Run()
	t.Logf("e2e.test ended after %v: %v; JUnit report in %s", time.Since(start).Round(time.Second), err, report)
	if err != nil {
		t.Errorf("e2e.test: %v (the failures: %s, junit_01.xml)", err, logf.Name())
	}
}

// waitCapacity waits until a CSIStorageCapacity of the chart's StorageClass (raid10) in the
// driver's namespace has room for a claim of the suites' smallest size.
func waitCapacity(ctx context.Context, t *testing.T, r *cluster.Rig, timeout time.Duration) {
	t.Helper()
	minSize := resource.MustParse("512Mi")
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := r.Env.Client.StorageV1().CSIStorageCapacities(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range l.Items {
			if c.StorageClassName == "raid10" && c.Capacity != nil && c.Capacity.Cmp(minSize) >= 0 {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no CSIStorageCapacity of class raid10 with 512Mi in %s after %v: %v", namespace, timeout, err)
	}
}

// e2eCommand is e2e.test (or ginkgo -p over it for PARALLEL > 1) with the rig's kubeconfig,
// driver.yaml and the focus and skip of the environment.
func e2eCommand(bin, kubeconfig, report string) *exec.Cmd {
	driver, _ := filepath.Abs("driver.yaml")
	flags := []string{"--kubeconfig=" + kubeconfig, "--storage.testdriver=" + driver,
		"--report-dir=" + report, "--provider=skeleton", "--node-os-distro=debian",
		"--ginkgo.timeout=24h", "--ginkgo.v"}
	if f := os.Getenv(focusEnv); f != "" {
		flags = append(flags, "--ginkgo.focus="+f)
	}
	if s := os.Getenv(skipEnv); s != "" {
		flags = append(flags, "--ginkgo.skip="+s)
	}
	if p, _ := strconv.Atoi(os.Getenv(parallelEnv)); p > 1 {
		// ginkgo's own flags before the binary, the suite's after "--" without the prefix.
		args := []string{"-p", "--procs=" + strconv.Itoa(p), "--timeout=24h", "-v"}
		var rest []string
		for _, f := range flags {
			if g, ok := strings.CutPrefix(f, "--ginkgo."); ok {
				if !strings.HasPrefix(g, "timeout") && g != "v" {
					args = append(args, "--"+g)
				}
				continue
			}
			rest = append(rest, f)
		}
		args = append(append(args, bin, "--"), rest...)
		return exec.Command(filepath.Join(filepath.Dir(bin), "ginkgo"), args...)
	}
	return exec.Command(bin, flags...)
}

// tool runs a bash snippet in root that prints a tool's path (hack/csi-tools.sh).
func tool(t *testing.T, root, script string) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

func run(t *testing.T, bin string, args ...string) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	t.Logf("%s", out)
}
