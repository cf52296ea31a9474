// Command raid10-csi is the raid10.csi.io CSI plugin: the controller (provisioning through
// Raid10Volume custom resources), the node plugin (RAID10 arrays over local disks served to
// the kernel over NBD), or both in one process (--mode=all, also the standalone mode).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
)

// Mode selects which CSI services the process runs.
type Mode string

// The modes of the plugin.
const (
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
	ModeAll        Mode = "all"
)

// Options holds the command-line configuration.
type Options struct {
	Mode     Mode
	Endpoint string
	NodeID   string
}

// Validate reports the first invalid option, naming it.
func (o *Options) Validate() error {
	switch o.Mode {
	case ModeController, ModeNode, ModeAll:
	default:
		return fmt.Errorf("--mode=%q: must be controller, node or all", o.Mode)
	}
	if o.Endpoint == "" {
		return errors.New("--endpoint: must not be empty")
	}
	return nil
}

func main() {
	klog.InitFlags(nil)
	var o Options
	flag.StringVar((*string)(&o.Mode), "mode", string(ModeAll), "which services to run: controller, node or all")
	flag.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI gRPC endpoint")
	flag.StringVar(&o.NodeID, "node-id", "", "this node's name (node and all modes)")
	flag.Parse()

	if err := o.Validate(); err != nil {
		klog.ErrorS(err, "Invalid options")
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, &o); err != nil {
		klog.ErrorS(err, "raid10-csi failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// run is replaced by the driver wiring as pkg/driver lands.
func run(ctx context.Context, o *Options) error {
	klog.InfoS("Starting raid10-csi", "mode", o.Mode, "endpoint", o.Endpoint, "nodeID", o.NodeID)
	return errors.New("raid10-csi: the CSI services are not built yet (see the CSI issue)")
}
