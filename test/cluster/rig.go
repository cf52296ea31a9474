package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

//go:embed node.sh
var nodeScript string

// tunnelScript is kubelet-tunnel.sh, which node.sh runs from the rig directory.
//
//go:embed kubelet-tunnel.sh
var tunnelScript string

// The node's network: QEMU's user network 10.0.0.0/16 (restrict=on). The guest is
// 10.0.0.15 (QEMU's default for the network), the gateway 10.0.0.2. The API server's
// Service range is 10.0.1.0/24, so the "kubernetes" Service's ClusterIP is 10.0.1.1, and a
// guestfwd carries 10.0.1.1:443 to the API server on the host's loopback: pods reach the
// API server at the address the kubelet gives them (KUBERNETES_SERVICE_HOST), as kube-proxy
// would make them, with no kube-proxy and no chart setting.
const (
	guestNetwork = "10.0.0.0/16"
	NodeIP       = "10.0.0.15"
	nodeGateway  = "10.0.0.2"
	serviceRange = "10.0.1.0/24"
	apiServerVIP = "10.0.1.1"
	// PodCIDR is the bridge network of the node's pods (CNI bridge + host-local).
	PodCIDR = "10.244.0.0/24"
	// NodeName is the Node object's name.
	NodeName = "raid10-node"
)

// NVMeModel is the model QEMU's emulated NVMe controllers report; /dev/disk/by-id names
// are nvme-<model with underscores>_<serial>.
const NVMeModel = "QEMU NVMe Ctrl"

// Config is what a Rig boots.
type Config struct {
	// NVMe is the number of emulated NVMe disks and DiskSize the size of each.
	NVMe     int
	DiskSize int64
	// StateSize is the size of the node's state disk (ext4: containerd, kubelet, plugin state).
	StateSize int64
	// Images are image tarballs imported into containerd (ctr -n k8s.io images import).
	Images []string
	// SandboxImage is the pause image's name (containerd's sandbox_image).
	SandboxImage string
	// Memory of the guest in MiB.
	Memory int
}

// Rig is a control plane on the host and one node in a QEMU guest.
type Rig struct {
	t   testing.TB
	cfg Config
	// Env is the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler).
	Env *kubeenv.Env
	// Dir holds the disks, the node's configuration and logs (shared with the guest).
	Dir string
	// Disks are the NVMe image files; Serials their serial numbers.
	Disks   []string
	Serials []string
	state   string
	bootN   int
	// imageSums are the SHA-256 sums of cfg.Images (images.list); stateCache is the cached
	// state disk these images are imported into; hostImported how many of them
	// prepareState imported.
	imageSums    []string
	stateCache   string
	hostImported int

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	res     *vm.Result
	runErr  error
	cmdSeq  int
	nodeDir string // the rig directory of the current boot
	tunnel  *kubeletTunnel
}

// Require skips (or, under CI, fails: internal/testenv) a test that needs the rig where a
// part is missing: QEMU and the kernel, containerd and the node's tools, the kubelet, the
// CNI plugins. Under -short (`make unit`) it skips as heavy.
func Require(t testing.TB) {
	t.Helper()
	vm.Require(t)
	for _, tool := range []string{"containerd", "ctr", "runc", "socat", "iptables", "mkfs.ext4"} {
		testenv.Tool(t, tool, "run `make deps` (hack/install-deps.sh)")
	}
	if _, err := os.Stat(filepath.Join(os.Getenv(kubeenv.BinDirEnv), "kubelet")); err != nil {
		testenv.Missing(t, "cluster: no kubelet in $%s (%v); run `make deps` (hack/build-tools.sh)", kubeenv.BinDirEnv, err)
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		testenv.Missing(t, "cluster: CNI plugins missing (%v); run `make deps` (containernetworking-plugins)", err)
	}
}

// New starts the control plane and prepares the node's disks; Boot starts the node.
func New(t testing.TB, cfg Config) *Rig {
	t.Helper()
	Require(t)
	base := filepath.Join(vm.CacheDir(), "cluster")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, "rig-")
	if err != nil {
		t.Fatal(err)
	}
	r := &Rig{t: t, cfg: cfg, Dir: dir}
	t.Cleanup(func() {
		r.Stop()
		if !t.Failed() || os.Getenv("RAID10_CLUSTER_KEEP") == "" {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("cluster: rig kept in %s", dir)
		}
	})
	if r.tunnel, err = startKubeletTunnel(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.tunnel.Close) // after the rig's cleanup above (LIFO): the node is stopped first
	r.Env = kubeenv.Start(t, kubeenv.WithControllerManager(), kubeenv.WithScheduler(),
		kubeenv.WithServingIPs(net.ParseIP(apiServerVIP)),
		kubeenv.WithAPIServerFlags("--service-cluster-ip-range="+serviceRange, "--feature-gates="+featureGates,
			"--egress-selector-config-file="+r.tunnel.ConfigFile()))

	for i := range cfg.NVMe {
		f := filepath.Join(dir, fmt.Sprintf("nvme%d.img", i))
		if err := truncate(f, cfg.DiskSize); err != nil {
			t.Fatal(err)
		}
		r.Disks = append(r.Disks, f)
		r.Serials = append(r.Serials, fmt.Sprintf("R10DISK%d", i))
	}
	r.state = filepath.Join(dir, "state.img")
	if err := r.prepareState(base); err != nil {
		t.Fatal(err)
	}
	return r
}

// stateRecipe is part of the cached state disk's key: bump it when the host's import
// (hostimport.go) changes what the disk holds (the containerd configuration, the import).
const stateRecipe = "state-1"

// prepareState makes the node's state disk with the images imported. Importing them was
// most of a cold node's boot under TCG (minutes: each layer decompressed and unpacked by the
// emulated CPU), so the host imports them (importOnHost: the same containerd binary,
// natively, in seconds) and keeps a copy of the disk in the cache: state-<key>.img, key the
// recipe, the disk's size and containerd's version, with state-<key>.list, the images'
// SHA-256 sums it holds. A later rig starts from that copy and imports only the images
// whose sums changed (usually the plugin image, whose Debian layer containerd already
// holds). The copy is sparse: about the images' unpacked size.
func (r *Rig) prepareState(base string) error {
	for _, img := range r.cfg.Images {
		sum, err := fileSum(img)
		if err != nil {
			return err
		}
		r.imageSums = append(r.imageSums, sum)
	}
	ver, err := exec.Command("containerd", "--version").Output()
	if err != nil {
		return fmt.Errorf("cluster: containerd --version: %w", err)
	}
	h := sha256.Sum256([]byte(fmt.Sprintf("%s %d %s", stateRecipe, r.cfg.StateSize, bytes.TrimSpace(ver))))
	r.stateCache = filepath.Join(base, fmt.Sprintf("state-%x.img", h[:8]))
	listed, _ := os.ReadFile(strings.TrimSuffix(r.stateCache, ".img") + ".list")
	if _, err := os.Stat(r.stateCache); err == nil {
		start := time.Now()
		if out, err := exec.Command("cp", "--sparse=always", "--reflink=auto", r.stateCache, r.state).CombinedOutput(); err != nil {
			return fmt.Errorf("cluster: copy the cached state disk: %w: %s", err, out)
		}
		have := strings.Fields(string(listed))
		kept := 0
		for _, s := range r.imageSums {
			if slices.Contains(have, s) {
				kept++
			}
		}
		r.t.Logf("cluster: state disk copied from the cache in %v (%s): %d of %d images imported already",
			time.Since(start).Round(time.Millisecond), r.stateCache, kept, len(r.imageSums))
		if kept == len(r.imageSums) {
			return nil
		}
	} else {
		if err := truncate(r.state, r.cfg.StateSize); err != nil {
			return err
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "node-state", r.state).CombinedOutput(); err != nil {
			return fmt.Errorf("cluster: mkfs.ext4 on the state disk: %w: %s", err, out)
		}
	}
	start := time.Now()
	n, err := r.importOnHost()
	if err != nil {
		return fmt.Errorf("cluster: import the images into the state disk on the host: %w", err)
	}
	r.hostImported = n
	r.t.Logf("cluster: %d images imported into the state disk on the host in %v", n, time.Since(start).Round(time.Millisecond))
	r.keepState()
	return nil
}

// keepState copies the state disk, images imported and nothing else yet, to the cache.
func (r *Rig) keepState() {
	start := time.Now()
	// Two rigs at once (two checkouts) each write their own file; the last rename wins. The
	// list only decides whether to mount the disk: what a disk holds is its own record,
	// images.imported, which the host's import reads (and node.sh, after it).
	tmp := fmt.Sprintf("%s.%d.tmp", r.stateCache, os.Getpid())
	out, err := exec.Command("cp", "--sparse=always", r.state, tmp).CombinedOutput()
	if err == nil {
		err = os.Rename(tmp, r.stateCache)
	}
	if err == nil {
		err = os.WriteFile(strings.TrimSuffix(r.stateCache, ".img")+".list", []byte(strings.Join(r.imageSums, "\n")+"\n"), 0o644)
	}
	if err != nil {
		// Not the test's failure: the next rig imports the images again.
		r.t.Logf("cluster: could not keep the state disk in the cache: %v %s", err, out)
		_ = os.Remove(tmp)
		return
	}
	r.t.Logf("cluster: state disk with the images kept in the cache in %v (%s)", time.Since(start).Round(time.Millisecond), r.stateCache)
}

// fileSum is the hex SHA-256 of file f.
func fileSum(f string) (string, error) {
	fh, err := os.Open(f)
	if err != nil {
		return "", err
	}
	defer func() { _ = fh.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", fmt.Errorf("cluster: read %s: %w", f, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func truncate(f string, size int64) error {
	fh, err := os.Create(f)
	if err != nil {
		return err
	}
	if err := fh.Truncate(size); err != nil {
		_ = fh.Close()
		return err
	}
	return fh.Close()
}

// ByID is the /dev/disk/by-id path of NVMe disk i in the guest.
func (r *Rig) ByID(i int) string {
	return "/dev/disk/by-id/nvme-" + strings.ReplaceAll(NVMeModel, " ", "_") + "_" + r.Serials[i]
}

// Boot starts the node (a new boot each call, on the same disks) and waits until its Node
// is Ready.
func (r *Rig) Boot(ctx context.Context) {
	t := r.t
	t.Helper()
	r.bootN++
	nodeDir := filepath.Join(r.Dir, fmt.Sprintf("boot%d", r.bootN))
	if err := os.MkdirAll(filepath.Join(nodeDir, "cmd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.writeNodeConfig(nodeDir); err != nil {
		t.Fatal(err)
	}
	port := strings.TrimPrefix(r.Env.Host, "https://127.0.0.1:")
	disks := []vm.Disk{{File: r.state, Serial: "node-state"}}
	for i, f := range r.Disks {
		disks = append(disks, vm.Disk{File: f, NVMe: true, Serial: r.Serials[i]})
	}
	opts := vm.Options{
		Memory:  r.cfg.Memory,
		CPUs:    2,
		Timeout: 3 * time.Hour,
		Dir:     r.Dir,
		RunDir:  filepath.Join(nodeDir, "run"),
		Disks:   disks,
		Net: &vm.Net{
			Network: guestNetwork,
			GuestFwd: map[string]string{
				apiServerVIP + ":443": "socat - TCP:127.0.0.1:" + port,
				kubeletTunnelAddr:     r.tunnel.GuestFwd(), // the API server's way to the kubelet
			},
		},
		Writable: []string{r.Dir},
		// node.sh syncs the state disk itself; a sync of everything would wait on the pods'
		// NBD volumes, whose servers have stopped, until the host kills QEMU 30 s later.
		NoExitSync: true,
		Modules: []string{"nbd", "ext4", "xfs", "overlay", "nvme", "virtio_blk", "virtio_net",
			"bridge", "veth", "br_netfilter", "nf_tables", "nft_compat", "nft_chain_nat", "nft_masq",
			"xt_MASQUERADE", "xt_comment", "xt_addrtype", "xt_conntrack", "nf_nat", "nf_conntrack",
			"dm_mod", "loop",
			// dm-crypt for the encrypted claim (its LUKS2 default: aes-xts-plain64; the
			// kernel's crypto user API for cryptsetup's checks).
			"dm_crypt", "xts", "algif_skcipher"},
		ModuleParams: map[string]string{"nbd": "nbds_max=32"},
		Env: []string{
			"RAID10_RIG=" + nodeDir,
			"NODE_IP=" + NodeIP, "NODE_PREFIX=16", "NODE_GW=" + nodeGateway,
			"NODE_NAME=" + NodeName, "STATE_DEV=/dev/vda", "KUBELET_TUNNEL=" + kubeletTunnelAddr,
			"KUBELET=" + filepath.Join(os.Getenv(kubeenv.BinDirEnv), "kubelet"),
		},
	}
	logf, err := os.Create(filepath.Join(nodeDir, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Stdout = logf
	for name, script := range map[string]string{"node.sh": nodeScript, "kubelet-tunnel.sh": tunnelScript} {
		if err := os.WriteFile(filepath.Join(nodeDir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	vctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	r.mu.Lock()
	r.cancel, r.done, r.nodeDir, r.res, r.runErr = cancel, done, nodeDir, nil, nil
	r.mu.Unlock()
	start := time.Now()
	go func() {
		defer close(done)
		defer func() { _ = logf.Close() }()
		res, err := vm.Run(vctx, opts, "exec /bin/sh "+vm.ShellJoin(filepath.Join(nodeDir, "node.sh")))
		r.mu.Lock()
		r.res, r.runErr = res, err
		r.mu.Unlock()
	}()
	t.Logf("cluster: booting the node (boot %d, rig %s)", r.bootN, nodeDir)
	// After a reboot the Node still says Ready (the node controller waits its grace period):
	// a boot is up once the kubelet reports the new kernel boot ID and Ready.
	oldBoot := ""
	if n, err := r.Env.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{}); err == nil {
		oldBoot = n.Status.NodeInfo.BootID
	}
	if err := r.waitNodeReady(ctx, oldBoot, 15*time.Minute); err != nil {
		r.dumpNode()
		t.Fatalf("cluster: node not Ready after %v: %v", time.Since(start).Round(time.Second), err)
	}
	t.Logf("cluster: node %s Ready %v after boot", NodeName, time.Since(start).Round(time.Second))
}

// waitNodeReady polls the Node until its Ready condition is True with a boot ID other than
// oldBoot.
func (r *Rig) waitNodeReady(ctx context.Context, oldBoot string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last string
	for {
		select {
		case <-r.done:
			return fmt.Errorf("the VM ended: %w", r.runErr)
		default:
		}
		n, err := r.Env.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		switch {
		case err == nil && n.Status.NodeInfo.BootID == oldBoot:
			last = "the Node still reports the previous boot " + oldBoot
		case err == nil:
			last = "no Ready condition"
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return nil
					}
					last = fmt.Sprintf("Ready=%s: %s", c.Status, c.Message)
				}
			}
		default:
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%s)", ctx.Err(), last)
		case <-r.done:
		case <-time.After(2 * time.Second):
		}
	}
}

// writeNodeConfig writes containerd's, the CNI's and the kubelet's configuration.
func (r *Rig) writeNodeConfig(dir string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["rig"] = &clientcmdapi.Cluster{Server: "https://" + apiServerVIP + ":443", CertificateAuthorityData: r.Env.Config.CAData}
	// The admin's token: the rig runs no node authorizer (RBAC only), so the kubelet acts
	// as a cluster administrator here.
	kc.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{Token: r.Env.Config.BearerToken}
	kc.Contexts["rig"] = &clientcmdapi.Context{Cluster: "rig", AuthInfo: "kubelet"}
	kc.CurrentContext = "rig"
	if err := clientcmd.WriteToFile(*kc, filepath.Join(dir, "kubelet.kubeconfig")); err != nil {
		return err
	}
	files := map[string]string{
		"containerd.toml": fmt.Sprintf(containerdConfig, strconv.Quote(r.cfg.SandboxImage)),
		"cni.conflist":    fmt.Sprintf(cniConfig, PodCIDR),
		"kubelet.yaml":    kubeletConfig,
		"images.list":     imagesList(r.cfg.Images, r.imageSums),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

const containerdConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %s
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/var/lib/cni-conf.d"
`

const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "rig",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`

// featureGates are turned on in the API server and the kubelet: CSIVolumeHealth (alpha in
// 1.37) makes the kubelet call the plugin's NodeGetVolumeHealth and NodeGetStorageHealth and
// the API server keep what it writes (pod status.volumeHealth, CSINode status.storageHealth).
const featureGates = "CSIVolumeHealth=true"

// kubeletConfig: cgroupfs (no systemd in the guest), no swap check, the API server let in
// anonymously (it comes through tunnel.go's tunnel; nothing else reaches the guest),
// eviction thresholds low for the small state disk. syncFrequency 10s (default 1m): the
// kubelet resyncs a pod's volumes, and so calls NodeExpandVolume after the controller's
// expansion, within 10 s instead of up to a minute (the story's step 6 waited 59 s for it).
// volumeStatsAggPeriod 10s (default 1m) is also how often the kubelet's CSIVolumeHealth asks
// the plugin for health.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
syncFrequency: 10s
volumeStatsAggPeriod: 10s
featureGates: {CSIVolumeHealth: true}
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
serializeImagePulls: false
maxPods: 30
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
`

// imagesList is node.sh's images.list: "SHA256 TARBALL" per image.
func imagesList(images, sums []string) string {
	var b strings.Builder
	for i, img := range images {
		fmt.Fprintf(&b, "%s %s\n", sums[i], img)
	}
	return b.String()
}

// Exec runs script with /bin/sh on the node (as root, outside any container) and returns
// its output; a non-zero exit status is an error with the output.
func (r *Rig) Exec(ctx context.Context, script string) (string, error) {
	r.mu.Lock()
	r.cmdSeq++
	n := r.cmdSeq
	dir := filepath.Join(r.nodeDir, "cmd")
	done := r.done
	r.mu.Unlock()
	base := filepath.Join(dir, fmt.Sprintf("%06d", n))
	if err := os.WriteFile(base+".sh.tmp", []byte(script+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(base+".sh.tmp", base+".sh"); err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(base + ".rc"); err == nil {
			out, _ := os.ReadFile(base + ".out")
			rc, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if rc != 0 {
				return string(out), fmt.Errorf("node: %q: exit status %d: %s", script, rc, bytes.TrimSpace(out))
			}
			return string(out), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("node: %q: %w", script, ctx.Err())
		case <-done:
			return "", fmt.Errorf("node: %q: the VM ended", script)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop ends the node cleanly (kubelet, containerd, power off) and waits for the VM.
func (r *Rig) Stop() {
	r.mu.Lock()
	done, cancel, dir := r.done, r.cancel, r.nodeDir
	r.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		cancel()
		<-done
	}
	if r.t.Failed() {
		r.dumpNode()
	}
}

// PowerCut kills the VM (QEMU) without warning: the disks keep what reached them.
func (r *Rig) PowerCut() {
	r.mu.Lock()
	done, cancel := r.done, r.cancel
	r.mu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
}

// dumpNode logs the tails of the node's logs.
func (r *Rig) dumpNode() {
	r.mu.Lock()
	dir, res, runErr := r.nodeDir, r.res, r.runErr
	r.mu.Unlock()
	for _, f := range []string{"node.log", "containerd.log", "kubelet.log"} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		r.t.Logf("cluster: %s tail:\n%s", f, tail(string(b), 60))
	}
	if res != nil {
		r.t.Logf("cluster: console tail:\n%s", res.ConsoleTail(40))
	}
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		r.t.Logf("cluster: vm: %v", runErr)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
