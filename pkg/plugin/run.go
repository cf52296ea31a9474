package plugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/metrics"
)

// Run runs the process of o.Mode until ctx is done or one of its parts fails, which stops
// the others: the holder (Holder), or the driver with the metrics endpoint and, in node
// and all modes, the node's pool, admin socket and handover (and in node mode the node
// agent and the kubelet registration). A node plugin hands its devices on as it stops
// (handover.stopSequence).
func Run(ctx context.Context, o *Options) error {
	if o.Mode == ModeHolder {
		h := &Holder{StateDir: o.StateDir, Wait: o.HandoverWait}
		return h.Run(ctx)
	}
	klog.InfoS("Starting raid10-csi", "version", o.version(), "mode", o.Mode, "endpoint", o.Endpoint, "nodeID", o.NodeID)
	p := &process{o: o}
	defer p.close()
	if err := p.open(ctx); err != nil {
		if errors.Is(err, errStoppedWaiting) {
			klog.InfoS("Told to stop before the predecessor handed anything over")
			return nil
		}
		return err
	}
	return p.serve(ctx)
}

// version is the binary's version; "dev" when not set.
func (o *Options) version() string {
	if o.Version == "" {
		return "dev"
	}
	return o.Version
}

// errStoppedWaiting: the context ended while a node plugin waited for its predecessor.
var errStoppedWaiting = errors.New("told to stop while waiting for the predecessor")

// process is one controller, node or all-mode plugin process being built and served.
type process struct {
	o        *Options
	opts     []driver.Option
	np       *nodePlugin    // node and all modes
	agentCfg *rest.Config   // node mode
	src      metrics.Source // the pool, in node and all modes
	reg      ctrlmetrics.RegistererGatherer
	driver   *driver.Driver
	checks   []metrics.Check
	capacity *driver.CachedStore // controller mode: GetCapacity's informer cache
}

// open builds the mode's parts: the volume store (controller), the node plugin (node and
// all), the metrics registry and the driver over them.
func (p *process) open(ctx context.Context) error {
	o := p.o
	p.opts = []driver.Option{
		driver.WithMode(o.Mode), driver.WithEndpoint(o.Endpoint), driver.WithNodeID(o.NodeID),
		driver.WithVersion(o.version()), driver.WithReadyTimeout(o.ReadyTimeout),
	}
	switch o.Mode {
	case driver.ModeController:
		c, cs, err := controllerClients(o, "raid10-csi-controller/"+o.version())
		if err != nil {
			return err
		}
		p.capacity = cs
		p.opts = append(p.opts, driver.WithVolumeStore(driver.NewKubeStore(c)), driver.WithCapacityReads(cs))
	case driver.ModeNode, driver.ModeAll:
		if err := p.openNode(ctx); err != nil {
			return err
		}
	}
	return p.newDriver()
}

// openNode opens the node plugin (after the predecessor's handover) and, in all mode, the
// local volume store over its pool.
func (p *process) openNode(ctx context.Context) error {
	o := p.o
	if o.Mode == driver.ModeNode {
		// Before the pool: a node without its API server fails before claiming disks.
		cfg, err := restConfig(o)
		if err != nil {
			return err
		}
		cfg.UserAgent = "raid10-csi-node/" + o.version()
		p.agentCfg = cfg
	}
	// A predecessor still serving keeps the devices until it is told to stop: this
	// process reports itself healthy and ready meanwhile, so that a surge update stops
	// the old pod.
	sb := &standby{addr: o.MetricsAddress}
	np, err := openNodePlugin(ctx, o, sb.start)
	sb.stop()
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return errStoppedWaiting
		}
		return err
	}
	p.np = np
	p.opts = append(p.opts, driver.WithNodeService(np.ns))
	p.src, p.checks = np.pool, append(p.checks, np.attacher.Ready)
	if o.Mode == driver.ModeAll {
		store, err := driver.NewLocalStore(np.pool, o.NodeID, filepath.Join(o.StateDir, driver.LocalRecordsFile))
		if err != nil {
			return err
		}
		store.UseDevices(np.attacher)
		p.opts = append(p.opts, driver.WithVolumeStore(store))
	}
	return nil
}

// newDriver builds the metrics registry and the driver with the CSI metrics interceptor.
func (p *process) newDriver() error {
	var io metrics.IOSource // the attacher's NBD request counters, in node and all modes
	if p.np != nil {
		io = p.np.attacher
	}
	reg, err := registry(p.o.Mode, p.src, io)
	if err != nil {
		return err
	}
	csiMetrics, err := metrics.NewCSIMetrics(reg)
	if err != nil {
		return err
	}
	d, err := driver.NewDriver(append(p.opts, driver.WithInterceptors(csiMetrics.UnaryServerInterceptor()))...)
	if err != nil {
		return err
	}
	p.reg, p.driver = reg, d
	p.checks = append([]metrics.Check{d.Ready}, p.checks...)
	return nil
}

// serve runs the process's tasks until ctx ends or one fails; a node plugin listens for a
// successor meanwhile and runs the stop sequence after.
func (p *process) serve(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	if p.np == nil {
		return runAll(ctx, cancel, p.tasks())
	}
	ho, err := listenHandover(p.o.StateDir, p.np)
	if err != nil {
		return err
	}
	go ho.serve(cancel)
	err = runAll(ctx, cancel, p.tasks())
	return ho.stopSequence(p.o.StateDir, p.o.HandoverWait, err, parent.Err() != nil)
}

// tasks are what the process runs side by side: the driver, and as the mode has them the
// admin socket, the metrics endpoint, the kubelet registration and the node agent.
func (p *process) tasks() []func(context.Context) error {
	o := p.o
	tasks := []func(context.Context) error{p.driver.Run}
	if p.capacity != nil {
		tasks = append(tasks, p.capacity.Run)
	}
	if p.np != nil {
		tasks = append(tasks, adminTask(o.StateDir, p.np))
	}
	if o.MetricsAddress != "" {
		tasks = append(tasks, func(ctx context.Context) error {
			return metrics.Serve(ctx, o.MetricsAddress, p.reg, p.checks...)
		})
	}
	if o.Mode == driver.ModeNode && o.RegistrationDir != "" {
		reg := &driver.Registration{DriverName: v1alpha1.DriverName, Endpoint: o.registrationPath(), Dir: o.RegistrationDir, Ready: p.driver.Ready}
		tasks = append(tasks, reg.Run)
	}
	if p.agentCfg != nil {
		tasks = append(tasks, func(ctx context.Context) error {
			// The node service without its agent would serve a pool nobody reconciles.
			return agent.Run(ctx, p.agentCfg, agent.Options{NodeName: o.NodeID, Pool: p.np.pool, Devices: p.np.attacher})
		})
	}
	return tasks
}

// close releases the node plugin, if the process opened one.
func (p *process) close() {
	if p.np != nil {
		p.np.close()
	}
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
