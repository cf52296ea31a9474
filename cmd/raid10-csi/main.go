// Command raid10-csi is the raid10.csi.io CSI plugin: the controller (provisioning through
// Raid10Volume custom resources), the node plugin (RAID10 arrays over local disks served to
// the kernel over NBD), or both in one process (--mode=all, also the standalone mode).
//
// --mode=node opens the node's disk pool (--pool-config), runs the node agent that reconciles
// the node's Raid10Volumes into it, and serves the CSI node service over it; it reattaches
// the NBD devices recorded in --state-dir first. --mode=all (standalone) is not built yet
// and fails at start-up saying so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// version is set at link time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

// Options holds the command-line configuration.
type Options struct {
	Mode         driver.Mode
	Endpoint     string
	NodeID       string
	Kubeconfig   string
	ReadyTimeout time.Duration
	// Node mode.
	PoolConfig string
	StateDir   string
	MaxVolumes int64
}

// Validate reports the first invalid option, naming it.
func (o *Options) Validate() error {
	switch o.Mode {
	case driver.ModeController, driver.ModeNode, driver.ModeAll:
	default:
		return fmt.Errorf("--mode=%q: must be controller, node or all", o.Mode)
	}
	if o.Endpoint == "" {
		return errors.New("--endpoint: must not be empty")
	}
	if o.Mode != driver.ModeController && o.NodeID == "" {
		return fmt.Errorf("--node-id: must be set in --mode=%s", o.Mode)
	}
	if o.Mode == driver.ModeNode && o.PoolConfig == "" {
		return errors.New("--pool-config: must be set in --mode=node")
	}
	if o.Mode == driver.ModeNode && o.StateDir == "" {
		return errors.New("--state-dir: must not be empty in --mode=node")
	}
	if o.ReadyTimeout <= 0 {
		return fmt.Errorf("--ready-timeout=%s: must be positive", o.ReadyTimeout)
	}
	return nil
}

func main() {
	klog.InitFlags(nil)
	var o Options
	flag.StringVar((*string)(&o.Mode), "mode", string(driver.ModeController), "which services to run: controller, node or all (all is not built yet)")
	flag.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI gRPC endpoint: unix:///path or tcp://host:port")
	flag.StringVar(&o.NodeID, "node-id", "", "this node's name (node and all modes)")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster config, else $KUBECONFIG or ~/.kube/config")
	flag.DurationVar(&o.ReadyTimeout, "ready-timeout", driver.DefaultReadyTimeout, "how long one CSI call waits for the node agent before answering DeadlineExceeded (the sidecar retries); keep it below the sidecar's --timeout")
	flag.StringVar(&o.PoolConfig, "pool-config", "", "JSON pool configuration of this node's disks (node mode)")
	flag.StringVar(&o.StateDir, "state-dir", "/var/lib/raid10-csi", "directory of the NBD device state file, kept across restarts (node mode)")
	flag.Int64Var(&o.MaxVolumes, "max-volumes", driver.DefaultMaxVolumesPerNode, "volumes per node that NodeGetInfo reports (at most the nbd module's nbds_max)")
	flag.Parse()

	if err := o.Validate(); err != nil {
		klog.ErrorS(err, "Invalid options")
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, &o); err != nil {
		klog.ErrorS(err, "raid10-csi failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// Run builds the driver for o.Mode and serves it until ctx is done.
func Run(ctx context.Context, o *Options) error {
	klog.InfoS("Starting raid10-csi", "version", version, "mode", o.Mode, "endpoint", o.Endpoint, "nodeID", o.NodeID)
	opts := []driver.Option{
		driver.WithMode(o.Mode), driver.WithEndpoint(o.Endpoint), driver.WithNodeID(o.NodeID),
		driver.WithVersion(version), driver.WithReadyTimeout(o.ReadyTimeout),
	}
	if o.Mode == driver.ModeController {
		c, err := kubeClient(o.Kubeconfig)
		if err != nil {
			return err
		}
		opts = append(opts, driver.WithVolumeStore(driver.NewKubeStore(c)))
	}
	if o.Mode == driver.ModeNode {
		return runNode(ctx, o, opts)
	}
	d, err := driver.NewDriver(opts...)
	if err != nil {
		return err
	}
	return d.Run(ctx)
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

// runNode runs the node plugin: the pool, the node agent reconciling this node's
// Raid10Volumes into it, and the CSI node service over it. On exit the NBD devices stay
// attached (a restarted plugin reattaches them) and the pool is closed.
func runNode(ctx context.Context, o *Options, opts []driver.Option) error {
	pc, err := pool.LoadConfig(o.PoolConfig)
	if err != nil {
		return err
	}
	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "raid10-csi-node/" + version
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	p, err := pool.Open(pc)
	if err != nil {
		return err
	}
	defer func() {
		if err := p.Close(); err != nil {
			klog.ErrorS(err, "Closing the pool")
		}
	}()
	att, err := driver.OpenPoolAttacher(ctx, p, filepath.Join(o.StateDir, "nbd-state.json"), kernel.Options{})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		att.Close(sctx)
	}()
	ns, err := driver.NewNodeServer(driver.NodeConfig{NodeID: o.NodeID, MaxVolumes: o.MaxVolumes,
		Attacher: att, Mounter: mount.New(""), Exec: utilexec.New()})
	if err != nil {
		return err
	}
	d, err := driver.NewDriver(append(opts, driver.WithNodeService(ns))...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	agentErr := make(chan error, 1)
	go func() {
		err := agent.Run(ctx, cfg, agent.Options{NodeName: o.NodeID, Pool: p})
		if err != nil {
			klog.ErrorS(err, "Node agent stopped")
			cancel() // the node service without its agent would serve a pool nobody reconciles
		}
		agentErr <- err
	}()
	err = d.Run(ctx)
	cancel()
	if aerr := <-agentErr; aerr != nil && err == nil {
		err = aerr
	}
	return err
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
