// Command raid10-csi is the raid10.csi.io CSI plugin: the controller (provisioning through
// Raid10Volume custom resources), the node plugin (RAID10 arrays over local disks served to
// the kernel over NBD), or both in one process without a cluster (--mode=all, standalone).
//
// --mode=controller writes Raid10Volumes through the API server (--kubeconfig, else the
// in-cluster config) and touches no disk.
//
// --mode=node opens the node's disk pool (--pool-config), runs the node agent that reconciles
// the node's Raid10Volumes into it, and serves the CSI node service over it; it reattaches
// the NBD devices recorded in --state-dir first. Disks added or replaced at run time on
// paths the pool configuration does not list are recorded in --state-dir/pool-disks.json
// (pool.Config.DisksFile) and opened again at the next start. Once its CSI endpoint serves, it registers
// itself with the kubelet (the plugin-registration socket in --registration-dir, reporting
// --kubelet-registration-path), so no node-driver-registrar sidecar is needed.
//
// --mode=all needs no cluster: it opens the pool and reattaches devices as --mode=node does,
// and serves identity, controller and node from one endpoint. The controller provisions
// straight in the pool (driver.LocalStore); what the pool cannot hold (volume mode, fsType,
// the CreateVolume name) is kept in --state-dir/volumes.json. Only this node exists:
// topology raid10.csi.io/node=<--node-id>.
//
// In node and all modes the plugin serves the node's admin socket, --state-dir/admin.sock
// (pkg/admin), for `kubectl-raid10 --local`.
//
// Every mode serves /metrics, /healthz and /readyz on --metrics-address (empty: none): CSI
// call counts and latencies; in node and all modes also the pool's volumes and disks and
// each attached volume's NBD requests (with the node agent's controller-runtime metrics in
// node mode). /readyz is 503 until the CSI
// endpoint serves and, in node and all modes, while the pool is closed or an attached
// volume's device has no connection being served.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// modeHolder is --mode=holder: the process that keeps a stopped node plugin's NBD devices
// for the next one (handover.go), run beside the node plugin and updated separately.
const modeHolder driver.Mode = "holder"

// version is set at link time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

// Options holds the command-line configuration.
type Options struct {
	Mode         driver.Mode
	Endpoint     string
	NodeID       string
	Kubeconfig   string
	ReadyTimeout time.Duration
	// Node and all modes.
	PoolConfig string
	StateDir   string
	MaxVolumes int64
	// MemberTimeout, when not 0, overrides the pool configuration's memberTimeout: the
	// deadline of one member request (negative: off).
	MemberTimeout time.Duration
	// MetricsAddress is where /metrics, /healthz and /readyz are served; empty: nowhere.
	MetricsAddress string
	// HandoverWait is how long a node plugin told to stop keeps serving while it waits for
	// a successor to hand its devices to (handover.go); 0: it stops at once.
	HandoverWait time.Duration
	// NetlinkNetNS is the network namespace file the kernel's nbd netlink family is dialed
	// in (node and all modes): /proc/1/ns/net with the host's PID namespace reaches the
	// host's, where kernels before netns-aware nbd keep the family. Empty: our own.
	NetlinkNetNS string
	// NBDMaxRequestKiB is the largest request the block layer sends a volume's /dev/nbdX
	// (its queue/max_sectors_kb, kernel.Options.MaxRequestKiB); 0 leaves the kernel's
	// default (128 KiB).
	NBDMaxRequestKiB int
	// Frontend is how the node serves a volume whose StorageClass names none: auto, nbd or
	// ublk (attach.ResolveFrontend; auto is nbd).
	Frontend string
	// RegistrationDir is the kubelet's plugins_registry directory the node mode registers
	// the driver in (driver.Registration); empty: no self-registration.
	RegistrationDir string
	// KubeletRegistrationPath is the CSI socket's path on the host, reported to the kubelet;
	// empty: the path of a unix --endpoint (right when the plugin runs on the host).
	KubeletRegistrationPath string
}

// registrationPath is the CSI endpoint's path as the kubelet sees it.
func (o *Options) registrationPath() string {
	if o.KubeletRegistrationPath != "" {
		return o.KubeletRegistrationPath
	}
	if p, ok := strings.CutPrefix(o.Endpoint, "unix://"); ok {
		return p
	}
	return ""
}

// nbdAttachOptions are the options of the node's NBD attach.
func nbdAttachOptions(o *Options) kernel.Options {
	kib := o.NBDMaxRequestKiB
	if kib == 0 {
		kib = -1 // leave the kernel's default
	}
	return kernel.Options{NetNS: o.NetlinkNetNS, MaxRequestKiB: kib}
}

// DefaultMetricsAddress is the default of --metrics-address.
const DefaultMetricsAddress = ":9810"

// Validate reports the first invalid option, naming it.
func (o *Options) Validate() error {
	switch o.Mode {
	case driver.ModeController, driver.ModeNode, driver.ModeAll:
	case modeHolder:
		if o.StateDir == "" {
			return errors.New("--state-dir: must not be empty in --mode=holder")
		}
		return nil
	default:
		return fmt.Errorf("--mode=%q: must be controller, node, all or holder", o.Mode)
	}
	if o.Endpoint == "" {
		return errors.New("--endpoint: must not be empty")
	}
	if o.Mode != driver.ModeController {
		if o.NodeID == "" {
			return fmt.Errorf("--node-id: must be set in --mode=%s", o.Mode)
		}
		if o.PoolConfig == "" {
			return fmt.Errorf("--pool-config: must be set in --mode=%s", o.Mode)
		}
		if o.StateDir == "" {
			return fmt.Errorf("--state-dir: must not be empty in --mode=%s", o.Mode)
		}
		if o.Mode == driver.ModeNode && o.RegistrationDir != "" {
			if !filepath.IsAbs(o.RegistrationDir) {
				return fmt.Errorf("--registration-dir=%q: must be an absolute path (the kubelet's plugins_registry) or empty", o.RegistrationDir)
			}
			if p := o.registrationPath(); !filepath.IsAbs(p) {
				return fmt.Errorf("--kubelet-registration-path=%q: must be the absolute host path of the CSI socket (needed with --registration-dir unless --endpoint is unix:///absolute/path)", p)
			}
		}
		if o.NetlinkNetNS != "" && !filepath.IsAbs(o.NetlinkNetNS) {
			return fmt.Errorf("--netlink-netns=%q: must be an absolute path to a network namespace file (e.g. /proc/1/ns/net) or empty", o.NetlinkNetNS)
		}
		if _, err := attach.ParseFrontend(o.Frontend); err != nil {
			return fmt.Errorf("--frontend: %w", err)
		}
		if k := o.NBDMaxRequestKiB; k != 0 && (k < 4 || k > 32768 || k%4 != 0) {
			return fmt.Errorf("--nbd-max-request-kib=%d: must be 0 (the kernel's default) or a multiple of 4 from 4 to 32768", k)
		}
		if err := pool.ValidateMemberTimeout(o.MemberTimeout); err != nil {
			return fmt.Errorf("--member-timeout=%s: %w", o.MemberTimeout, err)
		}
	}
	if o.HandoverWait < 0 {
		return fmt.Errorf("--handover-wait=%s: must not be negative", o.HandoverWait)
	}
	if o.ReadyTimeout <= 0 {
		return fmt.Errorf("--ready-timeout=%s: must be positive", o.ReadyTimeout)
	}
	if o.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(o.MetricsAddress); err != nil {
			return fmt.Errorf("--metrics-address=%q: must be host:port, :port or empty: %w", o.MetricsAddress, err)
		}
	}
	return nil
}

func main() {
	klog.InitFlags(nil)
	var o Options
	flag.StringVar((*string)(&o.Mode), "mode", string(driver.ModeController), "which services to run: controller (provisioning through the API server), node (pool, node agent and CSI node service), all (standalone, no cluster: identity, controller and node over the local pool) or holder (keeps a stopped node plugin's NBD devices for the next one, in --state-dir)")
	flag.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI gRPC endpoint: unix:///path or tcp://host:port")
	flag.StringVar(&o.NodeID, "node-id", "", "this node's name (node and all modes)")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (controller and node modes); empty: in-cluster config, else $KUBECONFIG or ~/.kube/config")
	flag.DurationVar(&o.ReadyTimeout, "ready-timeout", driver.DefaultReadyTimeout, "how long one CSI call waits for the node agent before answering DeadlineExceeded (the sidecar retries); keep it below the sidecar's --timeout")
	flag.StringVar(&o.PoolConfig, "pool-config", "", "JSON pool configuration of this node's disks (node and all modes)")
	flag.StringVar(&o.StateDir, "state-dir", "/var/lib/raid10-csi", "directory kept across restarts (node and all modes): the NBD device state file, the pool's record of the disks added or replaced at run time (pool-disks.json), and in all mode the volume records")
	flag.Int64Var(&o.MaxVolumes, "max-volumes", driver.DefaultMaxVolumesPerNode, "volumes per node that NodeGetInfo reports (at most the nbd module's nbds_max)")
	flag.DurationVar(&o.MemberTimeout, "member-timeout", 0, "deadline of one member request (node and all modes): a disk that has not answered within it is failed and the request completes from the other copy; negative: off; 0: the pool configuration's memberTimeout, else 5s. Must stay below the kernel's NBD request timeout less 2s")
	flag.StringVar(&o.MetricsAddress, "metrics-address", DefaultMetricsAddress, "host:port serving /metrics, /healthz and /readyz over HTTP; empty: none")
	flag.DurationVar(&o.HandoverWait, "handover-wait", DefaultHandoverWait, "node and all modes: after SIGTERM, how long to keep serving while waiting for a successor process to hand the NBD devices to (no I/O stall); 0: stop at once (requests in flight then wait for the kernel's request timeout)")
	flag.StringVar(&o.NetlinkNetNS, "netlink-netns", "", "node and all modes: the network namespace file to open the kernel's nbd netlink socket in, e.g. /proc/1/ns/net with the pod's hostPID (kernels such as Debian 12's 6.1 have the nbd family only in the host's network namespace); empty: the process's own")
	flag.StringVar(&o.Frontend, "frontend", string(attach.FrontendAuto), "node and all modes: how a volume whose StorageClass names no frontend is served: auto (nbd, which keeps online expansion), nbd (/dev/nbdX) or ublk (/dev/ublkbN; Linux 6.0+ with ublk_drv loaded; no online expansion)")
	flag.IntVar(&o.NBDMaxRequestKiB, "nbd-max-request-kib", kernel.DefaultMaxRequestKiB, "node and all modes: the largest request, in KiB, the kernel sends a volume's /dev/nbdX (its queue/max_sectors_kb; the kernel's default of 128 cuts a 1 MiB request into 8); 0: the kernel's default")
	flag.StringVar(&o.RegistrationDir, "registration-dir", driver.DefaultRegistrationDir, "node mode: the kubelet's plugin registration directory; the plugin registers itself there (socket raid10.csi.io-reg.sock), no node-driver-registrar needed; empty: no registration")
	flag.StringVar(&o.KubeletRegistrationPath, "kubelet-registration-path", "", "node mode: the CSI socket's path on the host, as the kubelet dials it (e.g. /var/lib/kubelet/plugins/raid10.csi.io/csi.sock); empty: the path of a unix --endpoint")
	flag.Parse()

	if err := o.Validate(); err != nil {
		klog.ErrorS(err, "Invalid options")
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := Run
	if o.Mode == modeHolder {
		run = runHolder
	}
	if err := run(ctx, &o); err != nil {
		klog.ErrorS(err, "raid10-csi failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// Run builds the driver for o.Mode and serves it (and the metrics endpoint, and in node mode
// the node agent) until ctx is done or one of them fails, which stops the others.
func Run(ctx context.Context, o *Options) error {
	klog.InfoS("Starting raid10-csi", "version", version, "mode", o.Mode, "endpoint", o.Endpoint, "nodeID", o.NodeID)
	opts := []driver.Option{
		driver.WithMode(o.Mode), driver.WithEndpoint(o.Endpoint), driver.WithNodeID(o.NodeID),
		driver.WithVersion(version), driver.WithReadyTimeout(o.ReadyTimeout),
	}
	var (
		src      metrics.Source // the pool, in node and all modes
		checks   []metrics.Check
		agentCfg *rest.Config // node mode
		np       *nodePlugin
	)
	switch o.Mode {
	case driver.ModeController:
		c, err := kubeClient(o.Kubeconfig)
		if err != nil {
			return err
		}
		opts = append(opts, driver.WithVolumeStore(driver.NewKubeStore(c)))
	case driver.ModeNode, driver.ModeAll:
		if o.Mode == driver.ModeNode {
			// Before the pool: a node without its API server fails before claiming disks.
			cfg, err := restConfig(o.Kubeconfig)
			if err != nil {
				return err
			}
			cfg.UserAgent = "raid10-csi-node/" + version
			agentCfg = cfg
		}
		// A predecessor still serving keeps the devices until it is told to stop: this
		// process reports itself healthy and ready meanwhile, so that a surge update stops
		// the old pod.
		sb := &standby{addr: o.MetricsAddress}
		var err error
		np, err = openNodePlugin(ctx, o, sb.start)
		sb.stop()
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				klog.InfoS("Told to stop before the predecessor handed anything over")
				return nil
			}
			return err
		}
		defer np.close()
		opts = append(opts, driver.WithNodeService(np.ns))
		src, checks = np.pool, append(checks, np.attacher.Ready)
		if o.Mode == driver.ModeAll {
			store, err := driver.NewLocalStore(np.pool, o.NodeID, filepath.Join(o.StateDir, driver.LocalRecordsFile))
			if err != nil {
				return err
			}
			store.UseDevices(np.attacher)
			opts = append(opts, driver.WithVolumeStore(store))
		}
	}
	var io metrics.IOSource // the attacher's NBD request counters, in node and all modes
	if np != nil {
		io = np.attacher
	}
	reg, err := registry(o.Mode, src, io)
	if err != nil {
		return err
	}
	csiMetrics, err := metrics.NewCSIMetrics(reg)
	if err != nil {
		return err
	}
	opts = append(opts, driver.WithInterceptors(csiMetrics.UnaryServerInterceptor()))
	d, err := driver.NewDriver(opts...)
	if err != nil {
		return err
	}
	checks = append([]metrics.Check{d.Ready}, checks...)

	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ho *handover
	if np != nil {
		if ho, err = listenHandover(o.StateDir, np); err != nil {
			return err
		}
		go ho.serve(cancel)
	}
	var tasks []func(context.Context) error
	tasks = append(tasks, d.Run)
	if np != nil {
		tasks = append(tasks, adminTask(o.StateDir, np))
	}
	if o.MetricsAddress != "" {
		tasks = append(tasks, func(ctx context.Context) error {
			return metrics.Serve(ctx, o.MetricsAddress, reg, checks...)
		})
	}
	if o.Mode == driver.ModeNode && o.RegistrationDir != "" {
		reg := &driver.Registration{DriverName: v1alpha1.DriverName, Endpoint: o.registrationPath(), Dir: o.RegistrationDir, Ready: d.Ready}
		tasks = append(tasks, reg.Run)
	}
	if agentCfg != nil {
		tasks = append(tasks, func(ctx context.Context) error {
			// The node service without its agent would serve a pool nobody reconciles.
			return agent.Run(ctx, agentCfg, agent.Options{NodeName: o.NodeID, Pool: np.pool, Devices: np.attacher})
		})
	}
	err = runAll(ctx, cancel, tasks)
	if ho == nil {
		return err
	}
	// A successor waiting (a surge update's new pod) or coming from now on gets the devices.
	ho.letGo()
	wait := time.Duration(0)
	if err == nil && parent.Err() != nil && !ho.successorTook() { // told to stop, no successor waiting
		gone, gerr := ho.giveToHolder(o.StateDir)
		if gone {
			return gerr
		}
		if !errors.Is(gerr, kernel.ErrNoHolder) {
			klog.ErrorS(gerr, "No handover to the holder")
		}
		wait = o.HandoverWait // no holder: the devices stay served while a successor may come
	}
	retired, herr := ho.stop(wait)
	if !retired {
		return err
	}
	return errors.Join(err, herr) // a successor has the devices
}

// registry returns the registry the metrics of mode go to and are served from, with the
// pool's metrics over src and the volumes' NBD request metrics over io (both nil in
// controller mode). In node mode it is controller-runtime's, which holds the node agent's
// metrics (reconciles, workqueue, API client) and the Go and process collectors already:
// gathering it beside a second registry would report those twice. Elsewhere it is a new one
// (metrics.NewRegistry).
func registry(mode driver.Mode, src metrics.Source, io metrics.IOSource) (ctrlmetrics.RegistererGatherer, error) {
	var reg ctrlmetrics.RegistererGatherer
	if mode == driver.ModeNode {
		reg = ctrlmetrics.Registry
		if err := reg.Register(metrics.NewPoolCollector(src)); err != nil {
			return nil, fmt.Errorf("register the pool metrics: %w", err)
		}
	} else {
		reg = metrics.NewRegistry(src)
	}
	if io != nil {
		if err := reg.Register(metrics.NewIOCollector(io)); err != nil {
			return nil, fmt.Errorf("register the NBD request metrics: %w", err)
		}
	}
	return reg, nil
}

// runAll runs every task until ctx is done; the first that fails cancels the others. It
// returns the first error, after every task has returned.
func runAll(ctx context.Context, cancel context.CancelFunc, tasks []func(context.Context) error) error {
	errc := make(chan error, len(tasks))
	for _, t := range tasks {
		go func() {
			err := t(ctx)
			if err != nil {
				cancel()
			}
			errc <- err
		}()
	}
	var first error
	for range tasks {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// nodePlugin is what the node and all modes share: the pool, the NBD attacher over it, and
// the CSI node service.
type nodePlugin struct {
	pool     *pool.Pool
	attacher *attach.PoolAttacher
	ns       *driver.NodeServer
}

// openNodePlugin opens the pool of --pool-config and the attacher with its state file in
// --state-dir (adopting the devices a predecessor or the holder hands over, reattaching the
// others recorded there), and builds the node service. waiting is called when a predecessor
// that still serves tells this process to wait for its devices (takeHandover).
func openNodePlugin(ctx context.Context, o *Options, waiting func()) (*nodePlugin, error) {
	pc, err := poolConfig(o)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	// Before any handover: a node that cannot serve the frontend fails here, while a
	// predecessor still serves.
	fe, _ := attach.ParseFrontend(o.Frontend) // checked by Validate
	if fe, err = attach.ResolveFrontend(fe); err != nil {
		return nil, err
	}
	// A predecessor still serving the state directory closes its arrays and hands its
	// devices over before this process opens the pool: the same disks are never open twice.
	var handed []kernel.Handed
	var p *pool.Pool
	var deadline time.Time
	for {
		if handed, err = takeHandover(ctx, o.StateDir, waiting); err != nil {
			return nil, err
		}
		if deadline.IsZero() { // from the end of a wait for a predecessor, however long
			deadline = time.Now().Add(handoverTimeout)
		}
		p, err = pool.Open(pc)
		if err == nil {
			break
		}
		for i := range handed {
			handed[i].Close()
		}
		// A predecessor still closing its arrays for the holder: its devices come next.
		if !errors.Is(err, pool.ErrDiskInUse) || len(handed) > 0 || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
	np := &nodePlugin{pool: p}
	np.attacher, err = attach.OpenPoolAttacher(ctx, p, filepath.Join(o.StateDir, "nbd-state.json"), nbdAttachOptions(o), handed...)
	if err != nil {
		np.close()
		return nil, err
	}
	if err := np.attacher.EnableUblk(ctx, fe, filepath.Join(o.StateDir, attach.UblkStateFile)); err != nil {
		np.close()
		return nil, err
	}
	np.ns, err = driver.NewNodeServer(driver.NodeConfig{NodeID: o.NodeID, MaxVolumes: o.MaxVolumes,
		Attacher: np.attacher, Mounter: mount.New(""), Exec: utilexec.New()})
	if err != nil {
		np.close()
		return nil, err
	}
	return np, nil
}

// poolConfig reads --pool-config, with --member-timeout over its memberTimeout and, unless
// the file sets disksFile, the pool's record of the disks given at run time in --state-dir
// (pool.DisksFileName): a disk replaced or added onto a path the configuration does not list
// stays in the pool across restarts.
func poolConfig(o *Options) (pool.Config, error) {
	pc, err := pool.LoadConfig(o.PoolConfig)
	if err != nil {
		return pc, err
	}
	if pc.DisksFile == "" {
		pc.DisksFile = filepath.Join(o.StateDir, pool.DisksFileName)
	}
	if o.MemberTimeout != 0 {
		pc.MemberTimeout = pool.Duration(o.MemberTimeout)
	}
	return pc, nil
}

// close stops serving the NBD devices, which stay attached (a restarted plugin reattaches
// them), and closes the pool.
func (np *nodePlugin) close() {
	if np.attacher != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		np.attacher.Close(sctx)
	}
	if err := np.pool.Close(); err != nil {
		klog.ErrorS(err, "Closing the pool")
	}
}

// kubeClient returns an uncached controller-runtime client for the raid10 types, from the
// kubeconfig file, else the in-cluster config, else $KUBECONFIG or ~/.kube/config.
func kubeClient(kubeconfig string) (client.Client, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "raid10-csi-controller/" + version
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// restConfig loads the kube client configuration from the kubeconfig file, else the
// in-cluster config, else $KUBECONFIG or ~/.kube/config.
func restConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kube client config: %w", err)
	}
	return cfg, nil
}
