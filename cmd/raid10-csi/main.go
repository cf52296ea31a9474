// Command raid10-csi is the raid10.csi.io CSI plugin: the controller (provisioning through
// Raid10Volume custom resources), the node plugin (RAID10 arrays over local disks served to
// the kernel over NBD), or both in one process (--mode=all, also the standalone mode).
//
// Only --mode=controller is built so far; node and all fail at start-up saying so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
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
	if o.ReadyTimeout <= 0 {
		return fmt.Errorf("--ready-timeout=%s: must be positive", o.ReadyTimeout)
	}
	return nil
}

func main() {
	klog.InitFlags(nil)
	var o Options
	flag.StringVar((*string)(&o.Mode), "mode", string(driver.ModeController), "which services to run: controller, node or all (only controller is built yet)")
	flag.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI gRPC endpoint: unix:///path or tcp://host:port")
	flag.StringVar(&o.NodeID, "node-id", "", "this node's name (node and all modes)")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster config, else $KUBECONFIG or ~/.kube/config")
	flag.DurationVar(&o.ReadyTimeout, "ready-timeout", driver.DefaultReadyTimeout, "how long one CSI call waits for the node agent before answering DeadlineExceeded (the sidecar retries); keep it below the sidecar's --timeout")
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
	d, err := driver.NewDriver(opts...)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}

// kubeClient returns an uncached controller-runtime client for the raid10 types, from the
// kubeconfig file, else the in-cluster config, else $KUBECONFIG or ~/.kube/config.
func kubeClient(kubeconfig string) (client.Client, error) {
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
	cfg.UserAgent = "raid10-csi-controller/" + version
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}
