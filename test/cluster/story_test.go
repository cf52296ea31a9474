package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	r10 "github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

const (
	// PauseEnv, a Go duration, pauses the story after step 3 with the cluster up
	// (`make cluster-demo`), so that it can be looked at with kubectl.
	PauseEnv = "RAID10_CLUSTER_PAUSE"

	ns         = "raid10-csi"
	release    = "raid10-csi"
	ioImage    = "raid10-csi/ioverify:test"
	pauseImage = "docker.io/raid10-csi/pause:0.1.0"
)

// story is the state the steps share.
type story struct {
	t       *testing.T
	r       *Rig
	c       ctrlclient.Client
	helm    string
	kubectl string
	plugin  string // kubectl-raid10
	root    string
	times   []string
	// sidecars: sidecars.<key>.image values for the chart (sidecarImages).
	sidecars map[string]string
	// free0 and capacity0: the Raid10Node's free bytes and the CSIStorageCapacity before any claim.
	free0, capacity0 int64
	// plainMarker starts every block that io-xfs writes (a plain volume), encMarker every
	// block io-enc writes (an encrypted one): the encrypted step looks for both on the disks.
	plainMarker, encMarker string
}

// step runs one step of the story and records its time.
func (s *story) step(name string, f func(ctx context.Context)) {
	s.t.Helper()
	start := time.Now()
	s.t.Logf("=== step %s", name)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	f(ctx)
	d := time.Since(start).Round(time.Second)
	s.times = append(s.times, fmt.Sprintf("%-40s %v", name, d))
	s.t.Logf("=== step %s done in %v", name, d)
}

// TestClusterStory is the user's story on a real kubelet (issue 15): helm install, claims,
// pods writing and verifying, a disk pulled and replaced, a plugin upgrade under I/O,
// expansion, a node reboot, deletion and uninstall. See doc.go.
func TestClusterStory(t *testing.T) {
	Require(t)
	s := &story{t: t, root: repoRoot(t), plainMarker: "r10-plain-" + randHex(t), encMarker: "r10-secret-" + randHex(t)}
	s.helm = helmBinary(t, s.root)
	s.plugin = goBuild(t, s.root, "./cmd/kubectl-raid10")
	images := buildImages(t, s.root)
	s.sidecars = sidecarImages(t, s.root, images)
	s.r = New(t, Config{NVMe: 5, DiskSize: 1 << 30, StateSize: 3 << 30, Images: images,
		SandboxImage: pauseImage, Memory: 3072})
	s.kubectl = filepath.Join(os.Getenv("RAID10_KUBE_BIN_DIR"), "kubectl")
	if _, err := os.Stat(s.kubectl); err != nil {
		testenv.Missing(t, "kubectl (hack/build-tools.sh): %v", err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{r10.AddToScheme, corev1.AddToScheme, appsv1.AddToScheme, storagev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ctrllog.SetLogger(klog.Background())
	var err error
	if s.c, err = ctrlclient.New(s.r.Env.Config, ctrlclient.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	defer func() { t.Logf("step times:\n%s", strings.Join(s.times, "\n")) }()

	s.step("0 boot the node", func(ctx context.Context) { s.r.Boot(ctx) })
	s.step("1 helm install", s.install)
	s.step("2 claims and pods", s.claims)
	s.step("3 volumes Healthy", s.healthy)
	s.step("VolumeAttributesClass: a write limit changed live", s.modify)
	if d, _ := time.ParseDuration(os.Getenv(PauseEnv)); d > 0 {
		t.Logf("cluster: pausing %v (%s): KUBECONFIG=%s kubectl get pods -A; the node's logs: %s", d, PauseEnv, s.r.Env.Kubeconfig, s.r.nodeDir)
		time.Sleep(d)
	}
	s.step("bad input: too large, unknown parameter", s.badInput)
	s.step("encrypted claim: no plaintext on the disks", s.encrypted)
	// The step 6 first: a volume grows only in place (docs/limitations.md), and the
	// replacement disk's extents are laid out by the rebuild, not in creation order.
	s.step("6 expand the ext4 claim", s.expand)
	s.step("4 pull a disk, replace it", s.pullDisk)
	s.step("5 helm upgrade under I/O", s.upgrade)
	s.step("7 reboot the node", s.reboot)
	s.step("8 delete pods and claims", s.deleteAll)
	s.step("9 helm uninstall", s.uninstall)
}

// podsInNS is the number of the release's pods: the controller, the node plugin, the holder.
const podsInNS = 3

// ioPods are the pods running ioverify.
var ioPods = []string{"io-0", "io-block", "io-xfs"}

// moreRounds waits until every ioverify pod logged n more verified rounds than it had
// (with no ERROR) and returns the longest single I/O of those new rounds (ms).
func (s *story) moreRounds(ctx context.Context, before map[string]int, n int) (stall int, after map[string]int) {
	s.t.Helper()
	after = map[string]int{}
	for _, p := range ioPods {
		s.poll(ctx, "pod "+p+" more rounds", func() error {
			rounds, maxs := s.rounds(ctx, p)
			if rounds < before[p]+n {
				return fmt.Errorf("%d rounds, want %d", rounds, before[p]+n)
			}
			for _, m := range maxs[before[p]:] {
				stall = max(stall, m)
			}
			after[p] = rounds
			return nil
		})
	}
	return stall, after
}

// roundCounts returns each ioverify pod's verified rounds so far.
func (s *story) roundCounts(ctx context.Context) map[string]int {
	out := map[string]int{}
	for _, p := range ioPods {
		out[p], _ = s.rounds(ctx, p)
	}
	return out
}

// rounds parses pod p's log: the verified rounds and each one's longest I/O; an ERROR
// line fails the test.
func (s *story) rounds(ctx context.Context, p string) (int, []int) {
	log := s.ioLog(ctx, p)
	if strings.Contains(log, "ERROR") {
		s.t.Fatalf("pod %s reported I/O errors:\n%s", p, log)
	}
	var maxs []int
	for _, m := range roundRE.FindAllStringSubmatch(log, -1) {
		v, _ := strconv.Atoi(m[2])
		maxs = append(maxs, v)
	}
	return len(maxs), maxs
}

// volumesHealth waits until every Raid10Volume has health h.
func (s *story) volumesHealth(ctx context.Context, n int, h r10.VolumeHealth, inSync string) {
	s.t.Helper()
	s.poll(ctx, fmt.Sprintf("%d volumes %s %s", n, h, inSync), func() error {
		var l r10.Raid10VolumeList
		if err := s.c.List(ctx, &l); err != nil {
			return err
		}
		if len(l.Items) != n {
			return fmt.Errorf("%d volumes", len(l.Items))
		}
		for _, v := range l.Items {
			if v.Status.Health != h || (inSync != "" && v.Status.InSync != inSync) {
				return fmt.Errorf("%s: %s %s", v.Name, v.Status.Health, v.Status.InSync)
			}
		}
		return nil
	})
}

// pullDisk removes NVMe disk 1 from the running node (PCI remove) under the pods' I/O,
// checks the pods saw no error and the volumes went Degraded, also in the pods'
// status.volumeHealth and the CSINode's status.storageHealth (health_test.go), then replaces
// it with the spare NVMe disk 4 through `kubectl raid10 replace-disk --follow`, after which
// those clear.
func (s *story) pullDisk(ctx context.Context) {
	t := s.t
	before := s.roundCounts(ctx)
	out, err := s.r.Exec(ctx, fmt.Sprintf(`for b in /sys/block/nvme*n1; do
  if [ "$(sed 's/ *$//' $b/device/serial)" = %s ]; then pci=$(basename "$(readlink -f $b/device/device)"); fi
done
[ -n "$pci" ] || { echo "no NVMe disk with serial %s"; exit 1; }
echo "removing PCI device $pci"
echo 1 > /sys/bus/pci/devices/$pci/remove`, s.r.Serials[1], s.r.Serials[1]))
	if err != nil {
		t.Fatalf("PCI remove: %v", err)
	}
	t.Logf("%s", out)
	s.volumesHealth(ctx, 3, r10.VolumeHealthDegraded, "")
	s.healthShowsDegraded(ctx)
	stall, _ := s.moreRounds(ctx, before, 2)
	t.Logf("disk pulled: volumes Degraded, 0 I/O errors in the pods; longest I/O across the failure %d ms", stall)
	var node r10.Raid10Node
	if err := s.c.Get(ctx, ctrlclient.ObjectKey{Name: NodeName}, &node); err != nil {
		t.Fatal(err)
	}
	old := ""
	for _, d := range node.Status.Disks {
		if d.State != r10.DiskStateHealthy {
			old = d.ID
		}
	}
	if old == "" {
		t.Fatalf("no failed disk in the Raid10Node: %+v", node.Status.Disks)
	}
	t.Logf("kubectl raid10 replace-disk %s %s %s --follow:\n%s", NodeName, old, s.r.ByID(4),
		s.run(ctx, s.plugin, "--kubeconfig", s.r.Env.Kubeconfig, "replace-disk", NodeName, old, s.r.ByID(4), "--follow", "--timeout", "15m"))
	s.volumesHealth(ctx, 3, r10.VolumeHealthHealthy, "4/4")
	s.healthCleared(ctx)
	s.moreRounds(ctx, s.roundCounts(ctx), 1)
}

// diskList is the chart's node.pool.disks naming the NVMe disks idx by their by-id links.
func (s *story) diskList(idx ...int) string {
	var disks []string
	for _, i := range idx {
		disks = append(disks, fmt.Sprintf(`{"path":%q}`, s.r.ByID(i)))
	}
	return "[" + strings.Join(disks, ",") + "]"
}

// upgrade runs `helm upgrade` with the disk list that names the replacement disk instead of
// the pulled one and a changed log level, which rolls the controller and the node plugin,
// under the pods' I/O: no error, and the longest I/O is the stall. The node DaemonSet surges:
// the new plugin pod becomes Ready beside the old one (waiting for its devices), the old pod
// is deleted and its plugin hands the devices straight to the new one, not to the holder.
func (s *story) upgrade(ctx context.Context) {
	t := s.t
	oldUID := s.nodePodUID(ctx)
	holderUID := s.podUID(ctx, "holder")
	controllers := s.podUIDs(ctx, "controller")
	before := s.roundCounts(ctx)
	start := time.Now()
	// node.logLevel, not logLevel: a node-only change rolls the node DaemonSet alone. Rolling
	// the two controller pods as well (eight containers started on the emulated CPUs) took
	// this step 1 to 6.5 more minutes and tests nothing of the I/O path.
	t.Logf("%s", s.run(ctx, s.helm, "upgrade", release, filepath.Join(s.root, "charts/raid10-csi"),
		"--namespace", ns, "--kubeconfig", s.r.Env.Kubeconfig, "--reuse-values", "--set", "node.logLevel=3", "--set-json", "node.pool.disks="+s.diskList(0, 4, 2, 3)))
	var next corev1.Pod
	nodePods := func() ([]corev1.Pod, error) {
		var l corev1.PodList
		err := s.c.List(ctx, &l, ctrlclient.InNamespace(ns), ctrlclient.MatchingLabels{"app.kubernetes.io/component": "node"})
		return l.Items, err
	}
	s.poll(ctx, "a new node plugin pod Ready", func() error {
		pods, err := nodePods()
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.UID != oldUID {
				next = p
				return podReady(&p)
			}
		}
		return fmt.Errorf("the node plugin pod %s still runs alone", oldUID)
	})
	ready := time.Since(start)
	oldSeen := false
	s.poll(ctx, "the old node plugin pod gone", func() error {
		pods, err := nodePods()
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.UID == oldUID {
				oldSeen = true
				return fmt.Errorf("the old node plugin pod %s is still there (%s)", p.Name, p.Status.Phase)
			}
		}
		return nil
	})
	t.Logf("node plugin: the new pod Ready %v after helm upgrade (old pod still there then: %v), the old pod gone after %v",
		ready.Round(time.Second), oldSeen, time.Since(start).Round(time.Second))
	s.waitPodsReady(ctx, ns, podsInNS)
	if got := s.podUID(ctx, "holder"); got != holderUID {
		t.Errorf("helm upgrade replaced the NBD holder pod (%s -> %s) together with the node plugin", holderUID, got)
	}
	if got := s.podUIDs(ctx, "controller"); !slices.Equal(got, controllers) {
		t.Errorf("a node-only upgrade (node.logLevel, the disk list) replaced the controller pods: %v -> %v", controllers, got)
	}
	stall, _ := s.moreRounds(ctx, before, 2)
	t.Logf("STALL: the longest single I/O of the pods across the node plugin's restart: %d ms (0 I/O errors)", stall)
	// The surge's point: the old plugin handed the devices to the new one directly.
	// Every log file of the container, the earlier runs' (0.log, 1.log, ...) and rotated ones
	// (N.log.<time>) too: a container that exited after the handover leaves it in 0.log.
	out, err := s.r.Exec(ctx, fmt.Sprintf("cd /var/log/pods/%s_%s_%s/raid10-csi && ls -l && cat $(ls -tr | grep -v '[.]gz$')", ns, next.Name, next.UID))
	if err != nil {
		t.Fatalf("the new node plugin's log: %v", err)
	}
	s.logRestarts(ctx, next.Name)
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "Waiting for the predecessor") || strings.Contains(l, "Took the NBD devices") {
			t.Logf("new plugin: %s", l)
		}
	}
	if !strings.Contains(out, `"Took the NBD devices over" from="predecessor"`) {
		t.Errorf("the new node plugin did not take the devices from the old one (a surge handover); its log's end:\n%s", out[max(0, len(out)-4000):])
	}
}

func (s *story) nodePodUID(ctx context.Context) types.UID { return s.podUID(ctx, "node") }

// logLastExits logs, for each container of the release's pods, its restarts and how its
// last run ended: after the reboot a restart count of 1 is the boot itself (the container
// of before the reboot), and more is the plugin exiting on the new boot, which costs the
// kubelet's back-off on the emulated CPUs.
func (s *story) logLastExits(ctx context.Context) {
	var l corev1.PodList
	if err := s.c.List(ctx, &l, ctrlclient.InNamespace(ns)); err != nil {
		s.t.Logf("pods in %s: %v", ns, err)
		return
	}
	for _, p := range l.Items {
		for _, c := range p.Status.ContainerStatuses {
			if term := c.LastTerminationState.Terminated; term != nil {
				s.t.Logf("pod %s container %s: %d restarts; the last run ended at %s, exit code %d (%s) %s",
					p.Name, c.Name, c.RestartCount, term.FinishedAt.UTC().Format(time.RFC3339), term.ExitCode, term.Reason, term.Message)
			}
		}
	}
}

// logRestarts logs, for each container of the pod that restarted, how its previous run ended
// (exit code, reason, time, and the log's end the kubelet kept: FallbackToLogsOnError).
func (s *story) logRestarts(ctx context.Context, name string) {
	var p corev1.Pod
	if err := s.c.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		s.t.Logf("pod %s: %v", name, err)
		return
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.RestartCount == 0 {
			continue
		}
		if term := c.LastTerminationState.Terminated; term != nil {
			s.t.Errorf("pod %s container %s restarted %d times; the last run ended at %s with exit code %d (%s):\n%s",
				name, c.Name, c.RestartCount, term.FinishedAt.UTC().Format(time.RFC3339), term.ExitCode, term.Reason, term.Message)
		} else {
			s.t.Errorf("pod %s container %s restarted %d times", name, c.Name, c.RestartCount)
		}
	}
}

// podUID is the UID of the one pod of the chart's component (node, holder).
// podUIDs returns the sorted UIDs of the namespace's pods of component.
func (s *story) podUIDs(ctx context.Context, component string) []types.UID {
	var l corev1.PodList
	if err := s.c.List(ctx, &l, ctrlclient.InNamespace(ns), ctrlclient.MatchingLabels{"app.kubernetes.io/component": component}); err != nil {
		s.t.Fatalf("%s pods: %v", component, err)
	}
	var uids []types.UID
	for _, p := range l.Items {
		uids = append(uids, p.UID)
	}
	slices.Sort(uids)
	return uids
}

func (s *story) podUID(ctx context.Context, component string) types.UID {
	var l corev1.PodList
	if err := s.c.List(ctx, &l, ctrlclient.InNamespace(ns), ctrlclient.MatchingLabels{"app.kubernetes.io/component": component}); err != nil || len(l.Items) != 1 {
		s.t.Fatalf("%s pod: %v (%d pods)", component, err, len(l.Items))
	}
	return l.Items[0].UID
}

// expand grows the StatefulSet's claim to 256 MiB: the resizer calls ControllerExpandVolume,
// the kubelet NodeExpandVolume, and the pod's filesystem grows (df on the node, through
// the pod's own mount).
func (s *story) expand(ctx context.Context) {
	t := s.t
	var pvc corev1.PersistentVolumeClaim
	key := ctrlclient.ObjectKey{Namespace: "default", Name: "data-io-0"}
	if err := s.c.Get(ctx, key, &pvc); err != nil {
		t.Fatal(err)
	}
	want := resource.MustParse("256Mi")
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = want
	start := time.Now()
	if err := s.c.Update(ctx, &pvc); err != nil {
		t.Fatal(err)
	}
	s.poll(ctx, "claim data-io-0 at 256Mi", func() error {
		if err := s.c.Get(ctx, key, &pvc); err != nil {
			return err
		}
		got := pvc.Status.Capacity[corev1.ResourceStorage]
		if got.Cmp(want) < 0 {
			return fmt.Errorf("capacity %s", got.String())
		}
		for _, c := range pvc.Status.Conditions {
			if c.Status == corev1.ConditionTrue {
				return fmt.Errorf("condition %s: %s", c.Type, c.Message)
			}
		}
		return nil
	})
	t.Logf("claim data-io-0 at %s %v after the update (ControllerExpandVolume, NodeExpandVolume)", want.String(), time.Since(start).Round(time.Second))
	var pod corev1.Pod
	if err := s.c.Get(ctx, ctrlclient.ObjectKey{Namespace: "default", Name: "io-0"}, &pod); err != nil {
		t.Fatal(err)
	}
	mnt := fmt.Sprintf("/var/lib/kubelet/pods/%s/volumes/kubernetes.io~csi/%s/mount", pod.UID, pvc.Spec.VolumeName)
	var size int64
	s.poll(ctx, "the pod's filesystem grown", func() error {
		out, err := s.r.Exec(ctx, "df -B1 --output=size "+mnt+" | tail -1")
		if err != nil {
			return err
		}
		size, _ = strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if size < 200<<20 {
			return fmt.Errorf("filesystem size %d", size)
		}
		return nil
	})
	t.Logf("claim data-io-0 expanded to %s; the pod's ext4 is %d MiB (%v after the update)", want.String(), size>>20, time.Since(start).Round(time.Second))
	s.moreRounds(ctx, s.roundCounts(ctx), 1)
}

// reboot restarts the VM on the same disks: the kubelet restarts the pods, whose ioverify
// first verifies what the volume holds.
func (s *story) reboot(ctx context.Context) {
	t := s.t
	// Each container start writes a new log file (0.log, 1.log, ...); the kubelet may remove
	// the older ones, so the container after the reboot is found by its file, not by counting
	// resume lines over all of them.
	before := map[string]string{}
	for _, p := range ioPods {
		before[p], _ = s.latestIOLog(ctx, p)
	}
	began := time.Now()
	s.r.Stop()
	t.Logf("wait: the node stopped after %v", time.Since(began).Round(100*time.Millisecond))
	s.r.Boot(ctx)
	s.waitPodsReady(ctx, ns, podsInNS)
	s.logLastExits(ctx)
	for _, p := range ioPods {
		s.waitPodRunning(ctx, "default", p)
		s.poll(ctx, "pod "+p+" verified its data after the reboot", func() error {
			file, log := s.latestIOLog(ctx, p)
			if strings.Contains(log, "ERROR") {
				t.Fatalf("pod %s after the reboot (%s):\n%s", p, file, log)
			}
			if file == before[p] {
				return fmt.Errorf("no new container log yet (%s)", file)
			}
			if !strings.Contains(log, "resume round") {
				return fmt.Errorf("no resume line in %s yet", file)
			}
			return nil
		})
	}
	s.moreRounds(ctx, s.roundCounts(ctx), 1)
	s.volumesHealth(ctx, 3, r10.VolumeHealthHealthy, "4/4")
}

// deleteAll deletes the pods and claims: the Raid10Volumes go, CSIStorageCapacity and the
// Raid10Node's free space return to their values before the claims.
func (s *story) deleteAll(ctx context.Context) {
	t := s.t
	for _, o := range []ctrlclient.Object{
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "io"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "io-block"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "io-xfs"}},
	} {
		if err := s.c.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	s.poll(ctx, "pods gone", func() error {
		var l corev1.PodList
		if err := s.c.List(ctx, &l, ctrlclient.InNamespace("default")); err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods left", len(l.Items))
		}
		return nil
	})
	for _, n := range []string{"data-io-0", "block", "xfs"} {
		if err := s.c.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	s.poll(ctx, "Raid10Volumes and PVs gone", func() error {
		var l r10.Raid10VolumeList
		var pvs corev1.PersistentVolumeList
		if err := s.c.List(ctx, &l); err != nil {
			return err
		}
		if err := s.c.List(ctx, &pvs); err != nil {
			return err
		}
		if len(l.Items)+len(pvs.Items) > 0 {
			return fmt.Errorf("%d volumes, %d PVs left", len(l.Items), len(pvs.Items))
		}
		return nil
	})
	s.poll(ctx, "capacity back to its starting value", func() error {
		free, capa := s.capacity(ctx)
		if free != s.free0 || capa != s.capacity0 {
			return fmt.Errorf("free %d (was %d), CSIStorageCapacity %d (was %d)", free, s.free0, capa, s.capacity0)
		}
		return nil
	})
	t.Logf("kubectl raid10 status:\n%s", s.run(ctx, s.plugin, "--kubeconfig", s.r.Env.Kubeconfig, "status"))
}

// capacity is the Raid10Node's free bytes and the largest CSIStorageCapacity of the driver.
func (s *story) capacity(ctx context.Context) (free, capa int64) {
	var node r10.Raid10Node
	if err := s.c.Get(ctx, ctrlclient.ObjectKey{Name: NodeName}, &node); err == nil {
		free = node.Status.Capacity.Free.Value()
	}
	var l storagev1.CSIStorageCapacityList
	if err := s.c.List(ctx, &l, ctrlclient.InNamespace(ns)); err == nil {
		for _, c := range l.Items {
			if c.Capacity != nil {
				capa = max(capa, c.Capacity.Value())
			}
		}
	}
	return free, capa
}

// uninstall runs helm uninstall: no pod, DaemonSet, Deployment, CSIDriver or volume of the
// driver is left; what stays is listed (the CRDs helm never deletes, the Raid10Node
// objects, the disks' labels on the node).
func (s *story) uninstall(ctx context.Context) {
	t := s.t
	t.Logf("%s", s.run(ctx, s.helm, "uninstall", release, "--namespace", ns, "--kubeconfig", s.r.Env.Kubeconfig, "--wait", "--timeout", "10m"))
	s.poll(ctx, "the driver's objects gone", func() error {
		var pods corev1.PodList
		if err := s.c.List(ctx, &pods, ctrlclient.InNamespace(ns)); err != nil {
			return err
		}
		var drivers storagev1.CSIDriverList
		if err := s.c.List(ctx, &drivers); err != nil {
			return err
		}
		var caps storagev1.CSIStorageCapacityList
		if err := s.c.List(ctx, &caps, ctrlclient.InNamespace(ns)); err != nil {
			return err
		}
		if n := len(pods.Items) + len(drivers.Items) + len(caps.Items); n > 0 {
			return fmt.Errorf("%d pods, %d CSIDrivers, %d CSIStorageCapacities left", len(pods.Items), len(drivers.Items), len(caps.Items))
		}
		return nil
	})
	var nodes r10.Raid10NodeList
	_ = s.c.List(ctx, &nodes)
	out, _ := s.r.Exec(ctx, "ls /var/lib/raid10-csi 2>&1; for d in /sys/block/nbd*; do [ -e $d/pid ] && echo \"$d attached\"; done; ls /var/lib/kubelet/plugins /var/lib/kubelet/plugins_registry; true")
	t.Logf("after helm uninstall: %d Raid10Node objects remain (the CRDs stay, as helm leaves crds/); on the node:\n%s", len(nodes.Items), out)
	if strings.Contains(out, "attached") {
		t.Errorf("an NBD device is still attached after helm uninstall:\n%s", out)
	}
}

func (s *story) install(ctx context.Context) {
	t := s.t
	args := []string{"install", release, filepath.Join(s.root, "charts/raid10-csi"),
		"--namespace", ns, "--create-namespace", "--kubeconfig", s.r.Env.Kubeconfig,
		"--set-json", "node.pool.disks=" + s.diskList(0, 1, 2, 3),
		// One controller: the rig has one node, where a second replica adds no availability,
		// only four more containers to start at install and reboot on the emulated CPUs
		// (issue 24). The chart's default of two is rendered and checked by test/deploy.
		"--set", "controller.replicas=1",
		// The encrypted step's key derivation: pbkdf2 at its least, as the VM tests do. The
		// default (argon2id, up to 1 GiB, tuned to 2 s) costs seconds of the emulated CPUs
		// at each stage; what it protects against is not what the story tests.
		"--set", "node.crypt.pbkdf=pbkdf2", "--set", "node.crypt.forceIterations=1000"}
	for key, img := range s.sidecars {
		args = append(args, "--set", "sidecars."+key+".image="+img)
	}
	out := s.run(ctx, s.helm, args...)
	t.Logf("%s", out)
	s.waitPodsReady(ctx, ns, podsInNS) // the controller, the node plugin, the holder
	var node r10.Raid10Node
	s.poll(ctx, "Raid10Node with 4 healthy disks", func() error {
		if err := s.c.Get(ctx, ctrlclient.ObjectKey{Name: NodeName}, &node); err != nil {
			return err
		}
		if node.Status.DiskCount != 4 || node.Status.HealthyDisks != 4 {
			return fmt.Errorf("disks %d healthy %d", node.Status.DiskCount, node.Status.HealthyDisks)
		}
		return nil
	})
	s.poll(ctx, "CSIStorageCapacity published", func() error {
		s.free0, s.capacity0 = s.capacity(ctx)
		if s.free0 == 0 || s.capacity0 == 0 {
			return fmt.Errorf("free %d, capacity %d", s.free0, s.capacity0)
		}
		return nil
	})
	t.Logf("kubectl get r10n:\n%s", s.run(ctx, s.kubectl, "--kubeconfig", s.r.Env.Kubeconfig, "get", "r10n", "-o", "wide"))
	for _, d := range node.Status.Disks {
		if !strings.Contains(d.Path, "nvme") {
			t.Errorf("disk %s at %q: not one of the NVMe disks", d.ID, d.Path)
		}
	}
}

// claims creates the xfs StorageClass, a StatefulSet on ext4, a Block claim and an xfs
// claim, each with a pod running ioverify, and waits for their first verified rounds.
func (s *story) claims(ctx context.Context) {
	start := time.Now()
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: "raid10-xfs"},
		Provisioner:          "raid10.csi.io",
		Parameters:           map[string]string{"members": "4", "csi.storage.k8s.io/fstype": "xfs"},
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		AllowVolumeExpansion: ptr.To(true),
	}
	s.create(ctx, sc)
	s.create(ctx, claim("block", "raid10", 64<<20, corev1.PersistentVolumeBlock))
	s.create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "io-block", Namespace: "default"},
		Spec: withClaim(ioPodSpec("data", "-path=/dev/xvda", true), "block")})
	s.create(ctx, claim("xfs", "raid10-xfs", 320<<20, corev1.PersistentVolumeFilesystem))
	s.create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "io-xfs", Namespace: "default"},
		Spec: withClaim(ioPodSpec("data", "-path=/data/verify.dat", false, "-marker="+s.plainMarker), "xfs")})
	// The StatefulSet's claim (ext4, the chart's StorageClass) comes last, so that its extents
	// follow the others' on every disk: step 6 grows it in place.
	s.poll(ctx, "the Block and xfs volumes provisioned", func() error {
		var l r10.Raid10VolumeList
		if err := s.c.List(ctx, &l); err != nil {
			return err
		}
		if len(l.Items) < 2 {
			return fmt.Errorf("%d volumes", len(l.Items))
		}
		for _, v := range l.Items {
			if v.Status.Phase != r10.VolumePhaseReady {
				return fmt.Errorf("volume %s: phase %q", v.Name, v.Status.Phase)
			}
		}
		return nil
	})
	labels := map[string]string{"app": "io"}
	s.create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "io", Namespace: "default"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       ioPodSpec("data", "-path=/data/verify.dat", false),
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{*claim("data", "raid10", 128<<20, corev1.PersistentVolumeFilesystem)},
		},
	})
	for _, p := range []string{"io-0", "io-block", "io-xfs"} {
		s.waitPodRunning(ctx, "default", p)
		s.t.Logf("pod %s Running %v into the step", p, time.Since(start).Round(time.Second))
		s.waitRounds(ctx, p, 1)
		s.t.Logf("pod %s verified its first round %v into the step", p, time.Since(start).Round(time.Second))
	}
}

func (s *story) healthy(ctx context.Context) {
	s.poll(ctx, "3 volumes Healthy 4/4", func() error {
		var l r10.Raid10VolumeList
		if err := s.c.List(ctx, &l); err != nil {
			return err
		}
		if len(l.Items) != 3 {
			return fmt.Errorf("%d volumes", len(l.Items))
		}
		for _, v := range l.Items {
			if v.Status.Health != r10.VolumeHealthHealthy || v.Status.InSync != "4/4" {
				return fmt.Errorf("%s: %s %s", v.Name, v.Status.Health, v.Status.InSync)
			}
		}
		return nil
	})
	s.t.Logf("kubectl get r10v:\n%s", s.run(ctx, s.kubectl, "--kubeconfig", s.r.Env.Kubeconfig, "get", "r10v"))
	s.throughKubelet(ctx)
	s.t.Logf("kubectl raid10 status:\n%s", s.run(ctx, s.plugin, "--kubeconfig", s.r.Env.Kubeconfig, "status"))
	var l r10.Raid10VolumeList
	if err := s.c.List(ctx, &l); err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("kubectl raid10 describe volume:\n%s", s.run(ctx, s.plugin, "--kubeconfig", s.r.Env.Kubeconfig, "describe", "volume", l.Items[0].Name))
}

// throughKubelet reads a pod's log and runs a command in it through the API server, which
// reaches the node's kubelet only through the rig's tunnel (tunnel.go, kubelet-tunnel.sh):
// `kubectl logs` shows the pod's verified rounds, and `kubectl exec` runs one more round of
// ioverify on the pod's volume.
func (s *story) throughKubelet(ctx context.Context) {
	kc := s.r.Env.Kubeconfig
	if l := s.run(ctx, s.kubectl, "--kubeconfig", kc, "logs", "io-0", "--tail=3"); !roundRE.MatchString(l) {
		s.t.Fatalf("kubectl logs io-0: no verified round in\n%s", l)
	}
	out := s.run(ctx, s.kubectl, "--kubeconfig", kc, "exec", "io-0", "--",
		"/ioverify", "-path=/data/exec.dat", "-size=262144", "-bs=65536", "-rounds=1")
	if !strings.Contains(out, "round 1 ok") {
		s.t.Fatalf("kubectl exec io-0 -- /ioverify: no verified round in\n%s", out)
	}
	s.t.Logf("kubectl logs and exec through the API server: %s", strings.TrimSpace(out))
}

// badInput: a claim larger than the node can hold leaves its pod Pending with a scheduler
// event that says so; a StorageClass parameter the driver does not know gets a
// ProvisioningFailed event on the claim that names it. Both are deleted again.
func (s *story) badInput(ctx context.Context) {
	s.create(ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "raid10-bogus"},
		Provisioner:       "raid10.csi.io",
		Parameters:        map[string]string{"members": "4", "stripes": "7"},
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	})
	objs := []ctrlclient.Object{
		claim("huge", "raid10", 100<<30, corev1.PersistentVolumeFilesystem),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "huge", Namespace: "default"},
			Spec: withClaim(ioPodSpec("data", "-path=/data/x", false), "huge")},
		claim("bogus", "raid10-bogus", 64<<20, corev1.PersistentVolumeFilesystem),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bogus", Namespace: "default"},
			Spec: withClaim(ioPodSpec("data", "-path=/data/x", false), "bogus")},
	}
	for _, o := range objs {
		s.create(ctx, o)
	}
	s.poll(ctx, "events for the bad claims", func() error {
		var ev corev1.EventList
		if err := s.c.List(ctx, &ev, ctrlclient.InNamespace("default")); err != nil {
			return err
		}
		var huge, bogus string
		for _, e := range ev.Items {
			switch {
			case e.InvolvedObject.Name == "huge" && e.Reason == "FailedScheduling":
				huge = e.Message
			case e.InvolvedObject.Name == "bogus" && strings.Contains(e.Message, "stripes"):
				bogus = e.Reason + ": " + e.Message
			}
		}
		if huge == "" || bogus == "" {
			return fmt.Errorf("huge: %q, bogus: %q", huge, bogus)
		}
		s.t.Logf("100Gi claim: pod Pending: %s", huge)
		s.t.Logf("unknown parameter: %s", bogus)
		return nil
	})
	var pod corev1.Pod
	if err := s.c.Get(ctx, ctrlclient.ObjectKey{Namespace: "default", Name: "huge"}, &pod); err != nil || pod.Status.Phase != corev1.PodPending {
		s.t.Fatalf("pod huge: %v, phase %s; want Pending", err, pod.Status.Phase)
	}
	for _, o := range objs {
		if err := s.c.Delete(ctx, o); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := s.c.Delete(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "raid10-bogus"}}); err != nil {
		s.t.Fatal(err)
	}
}

// ioBlocks blocks of ioBlockSize bytes: what ioverify writes and verifies each round (2 MiB).
const ioBlocks, ioBlockSize = 32, 64 << 10

// ioPodSpec runs ioverify on the volume "data" (mounted at /data, or as /dev/xvda), with
// args added to its command line.
func ioPodSpec(vol, target string, block bool, args ...string) corev1.PodSpec {
	c := corev1.Container{
		Name: "io", Image: ioImage, ImagePullPolicy: corev1.PullNever,
		Args: append([]string{target, fmt.Sprintf("-size=%d", ioBlocks*ioBlockSize), fmt.Sprintf("-bs=%d", ioBlockSize), "-pause=200ms"}, args...),
	}
	if block {
		c.VolumeDevices = []corev1.VolumeDevice{{Name: vol, DevicePath: "/dev/xvda"}}
	} else {
		c.VolumeMounts = []corev1.VolumeMount{{Name: vol, MountPath: "/data"}}
	}
	return corev1.PodSpec{Containers: []corev1.Container{c}, TerminationGracePeriodSeconds: ptr.To[int64](5)}
}

func withClaim(spec corev1.PodSpec, claimName string) corev1.PodSpec {
	spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}}
	return spec
}

func claim(name, class string, size int64, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(class),
			VolumeMode:       ptr.To(mode),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}},
		},
	}
}

func (s *story) create(ctx context.Context, obj ctrlclient.Object) {
	s.t.Helper()
	if err := s.c.Create(ctx, obj); err != nil {
		s.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// poll calls f every 2 s until it returns nil; at ctx's end the test fails with f's error.
// A wait of 5 s or more is logged with its time, so a step's time can be read wait by wait
// (where the story spends its minutes on the emulated node; issue 24).
func (s *story) poll(ctx context.Context, what string, f func() error) {
	s.t.Helper()
	start := time.Now()
	var last error
	var seen []string // what was waited on, each change with its time (a wait of 30 s or more logs them)
	for {
		if last = f(); last == nil {
			if d := time.Since(start); d >= 5*time.Second {
				s.t.Logf("wait: %s after %v", what, d.Round(100*time.Millisecond))
				if d >= 30*time.Second {
					s.t.Logf("wait: %s: what it waited on:\n%s", what, strings.Join(seen, "\n"))
				}
			}
			return
		}
		if msg := last.Error(); len(seen) == 0 || !strings.HasSuffix(seen[len(seen)-1], "] "+msg) {
			if len(seen) == 20 {
				seen = append(seen[:10], seen[11:]...) // the first and the latest changes
			}
			seen = append(seen, fmt.Sprintf("  [+%v] %s", time.Since(start).Round(time.Second), msg))
		}
		select {
		case <-ctx.Done():
			s.dumpPlugin()
			s.r.dumpNode()
			s.t.Fatalf("%s: %v (%v)", what, last, ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}

// waitPodsReady waits until the namespace has at least n pods, all Running and Ready.
func (s *story) waitPodsReady(ctx context.Context, namespace string, n int) {
	s.t.Helper()
	s.poll(ctx, "pods in "+namespace+" Ready", func() error {
		var l corev1.PodList
		if err := s.c.List(ctx, &l, ctrlclient.InNamespace(namespace)); err != nil {
			return err
		}
		if len(l.Items) < n {
			return fmt.Errorf("%d pods, want %d", len(l.Items), n)
		}
		for _, p := range l.Items {
			if err := podReady(&p); err != nil {
				return err
			}
		}
		return nil
	})
}

func podReady(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("pod %s: %s %s", p.Name, p.Status.Phase, podWhy(p))
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("pod %s not Ready %s", p.Name, podWhy(p))
}

func podWhy(p *corev1.Pod) string {
	var w []string
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			w = append(w, c.Name+": "+c.State.Waiting.Reason+" "+c.State.Waiting.Message)
		case c.State.Terminated != nil:
			w = append(w, fmt.Sprintf("%s: terminated %s (%d)", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode))
		case !c.Ready:
			w = append(w, c.Name+": not ready")
		}
		if c.RestartCount > 0 {
			w = append(w, fmt.Sprintf("%s restarted %d times", c.Name, c.RestartCount))
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			w = append(w, string(c.Type)+": "+c.Message)
		}
	}
	return strings.Join(w, "; ")
}

func (s *story) waitPodRunning(ctx context.Context, namespace, name string) {
	s.t.Helper()
	s.poll(ctx, "pod "+name+" Running", func() error {
		var p corev1.Pod
		if err := s.c.Get(ctx, ctrlclient.ObjectKey{Namespace: namespace, Name: name}, &p); err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			var ev corev1.EventList
			_ = s.c.List(ctx, &ev, ctrlclient.InNamespace(namespace))
			var msgs []string
			for _, e := range ev.Items {
				if e.InvolvedObject.Name == name || e.Type == corev1.EventTypeWarning {
					msgs = append(msgs, e.Reason+": "+e.Message)
				}
			}
			return fmt.Errorf("%s %s; events: %s", p.Status.Phase, podWhy(&p), strings.Join(msgs, " | "))
		}
		return nil
	})
}

var roundRE = regexp.MustCompile(`round (\d+) ok: .* max-io (\d+)ms errors (\d+)`)

// ioLog reads the ioverify output of pod name (default namespace) from the node's
// /var/log/pods (the API server cannot reach the kubelet for `kubectl logs`).
func (s *story) ioLog(ctx context.Context, name string) string {
	out, err := s.r.Exec(ctx, fmt.Sprintf("cat /var/log/pods/default_%s_*/io/*.log 2>/dev/null", name))
	if err != nil {
		return ""
	}
	return out
}

// latestIOLog returns the newest ioverify log file of pod name (the running container's)
// and its content.
func (s *story) latestIOLog(ctx context.Context, name string) (file, content string) {
	out, err := s.r.Exec(ctx, fmt.Sprintf(`f=$(ls -v /var/log/pods/default_%s_*/io/*.log 2>/dev/null | tail -n 1)
[ -n "$f" ] || exit 0
echo "$f"; cat "$f"`, name))
	if err != nil {
		return "", ""
	}
	file, content, _ = strings.Cut(out, "\n")
	return file, content
}

// waitRounds waits until pod name logged at least n verified rounds, and fails on ERROR.
func (s *story) waitRounds(ctx context.Context, name string, n int) (rounds int, maxIO int) {
	s.t.Helper()
	s.poll(ctx, "pod "+name+" verified rounds", func() error {
		log := s.ioLog(ctx, name)
		if strings.Contains(log, "ERROR") {
			s.t.Fatalf("pod %s reported I/O errors:\n%s", name, log)
		}
		rounds, maxIO = 0, 0
		for _, m := range roundRE.FindAllStringSubmatch(log, -1) {
			rounds++
			if v, _ := strconv.Atoi(m[2]); v > maxIO {
				maxIO = v
			}
		}
		if rounds < n {
			return fmt.Errorf("%d of %d rounds", rounds, n)
		}
		return nil
	})
	return rounds, maxIO
}

// run runs a host command and fails the test on error.
func (s *story) run(ctx context.Context, bin string, args ...string) string {
	s.t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	scratch := s.t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+scratch, "HELM_CONFIG_HOME="+scratch, "HELM_DATA_HOME="+scratch)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// dumpPlugin logs, for a wait that timed out, what the node and the API server say of the
// volumes: the node plugin's warnings and errors and the tail of its log (from the node's
// /var/log/pods), and the Raid10Volumes with their status. Best effort: the node may be
// gone.
func (s *story) dumpPlugin() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := s.r.Exec(ctx, `for f in /var/log/pods/raid10-csi_raid10-csi-node-*/raid10-csi/*.log; do
[ -f "$f" ] || continue
echo "== $f: warnings and errors"; grep -E ' [EW][0-9]{4} ' "$f" | tail -n 80
echo "== $f: last lines"; tail -n 40 "$f"
done`)
	s.t.Logf("cluster: node plugin log (err %v):\n%s", err, out)
	cmd := exec.CommandContext(ctx, s.kubectl, "--kubeconfig", s.r.Env.Kubeconfig, "get", "r10v", "-o", "yaml")
	b, err := cmd.CombinedOutput()
	s.t.Logf("cluster: kubectl get r10v -o yaml (err %v):\n%s", err, b)
}
