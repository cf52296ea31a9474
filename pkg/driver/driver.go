package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/sockfile"
)

// Mode selects which CSI services a Driver serves.
type Mode string

// The modes of the driver.
const (
	// ModeController serves identity and controller (the Deployment next to the sidecars).
	ModeController Mode = "controller"
	// ModeNode serves identity and node (the DaemonSet).
	ModeNode Mode = "node"
	// ModeAll serves all three in one process: the standalone mode, without a cluster. The
	// controller's VolumeStore is then a LocalStore over the node's own pool, and the node
	// service (WithNodeService) serves that pool's volumes.
	ModeAll Mode = "all"
)

// Defaults of the options.
const (
	DefaultReadyTimeout = 60 * time.Second
	DefaultPollInterval = 250 * time.Millisecond
)

// Driver is the raid10.csi.io CSI plugin: a gRPC server with the services its Mode selects.
// Every side effect (the volume store, the node service with its pool, attacher and mounter)
// comes in through an Option.
type Driver struct {
	name, version string
	mode          Mode
	endpoint      string
	nodeID        string
	store         VolumeStore
	capacity      CapacityReads
	readyTimeout  time.Duration
	pollInterval  time.Duration

	// interceptors run outside logAndMap, in order (WithInterceptors).
	interceptors []grpc.UnaryServerInterceptor
	serving      atomic.Bool // Run listens and serves

	identity   *IdentityServer
	controller *ControllerServer
	node       *NodeServer // set by WithNodeService (node.go)
}

// Option configures a Driver.
type Option func(*Driver)

// WithMode sets the mode (default ModeController).
func WithMode(m Mode) Option { return func(d *Driver) { d.mode = m } }

// WithEndpoint sets the endpoint to serve on: unix:///path/csi.sock or tcp://host:port.
func WithEndpoint(e string) Option { return func(d *Driver) { d.endpoint = e } }

// WithVersion sets the vendor version that GetPluginInfo reports.
func WithVersion(v string) Option { return func(d *Driver) { d.version = v } }

// WithDriverName overrides the CSI driver name (default raid10.csi.io).
func WithDriverName(n string) Option { return func(d *Driver) { d.name = n } }

// WithNodeID sets this node's name (node and all modes).
func WithNodeID(id string) Option { return func(d *Driver) { d.nodeID = id } }

// WithVolumeStore sets the store of Raid10Volume and Raid10Node objects (controller and all
// modes): a KubeStore, or in the standalone mode a LocalStore.
func WithVolumeStore(s VolumeStore) Option { return func(d *Driver) { d.store = s } }

// WithCapacityReads gives GetCapacity a reader of its own (a KubeStore over an informer
// cache, NewCachedStore): the provisioner asks every node's capacity each poll, and a node's
// answer read from the API server costs three requests (issue 28). Until the reader is
// synced, and without one, GetCapacity reads the VolumeStore; CreateVolume and expansion
// always check the live objects.
func WithCapacityReads(r CapacityReads) Option { return func(d *Driver) { d.capacity = r } }

// WithReadyTimeout bounds how long one CreateVolume, ControllerExpandVolume or DeleteVolume
// call waits for the node agent before answering DeadlineExceeded (the sidecar retries and
// the retry resumes the wait).
func WithReadyTimeout(t time.Duration) Option { return func(d *Driver) { d.readyTimeout = t } }

// WithPollInterval sets how often a wait reads the volume's status.
func WithPollInterval(t time.Duration) Option { return func(d *Driver) { d.pollInterval = t } }

// WithInterceptors adds unary interceptors that run outside the one that maps errors to gRPC
// codes and logs them, so they see each call as the client does (its code, its whole
// duration): e.g. metrics.CSIMetrics.UnaryServerInterceptor.
func WithInterceptors(i ...grpc.UnaryServerInterceptor) Option {
	return func(d *Driver) { d.interceptors = append(d.interceptors, i...) }
}

// NewDriver builds a Driver from options, reporting the first missing or invalid one.
func NewDriver(opts ...Option) (*Driver, error) {
	d := &Driver{
		name:         v1alpha1.DriverName,
		version:      "dev",
		mode:         ModeController,
		readyTimeout: DefaultReadyTimeout,
		pollInterval: DefaultPollInterval,
	}
	for _, o := range opts {
		o(d)
	}
	if d.endpoint == "" {
		return nil, fmt.Errorf("endpoint: must be set: %w", ErrInvalidArgument)
	}
	if d.readyTimeout <= 0 || d.pollInterval <= 0 {
		return nil, fmt.Errorf("ready timeout and poll interval must be positive: %w", ErrInvalidArgument)
	}
	switch d.mode {
	case ModeController, ModeNode, ModeAll:
	default:
		return nil, fmt.Errorf("mode %q: must be controller, node or all: %w", d.mode, ErrInvalidArgument)
	}
	if d.mode != ModeNode {
		if d.store == nil {
			return nil, fmt.Errorf("mode %s needs a VolumeStore (a kube client, or a LocalStore in mode all): %w", d.mode, ErrInvalidArgument)
		}
		d.controller = &ControllerServer{
			store:        d.store,
			capacity:     d.capacity,
			locks:        &VolumeLocks{},
			readyTimeout: d.readyTimeout,
			pollInterval: d.pollInterval,
		}
	}
	if d.mode != ModeController && d.node == nil {
		return nil, fmt.Errorf("mode %s needs the node service (WithNodeService): %w", d.mode, ErrInvalidArgument)
	}
	d.identity = &IdentityServer{name: d.name, version: d.version, controller: d.controller != nil}
	return d, nil
}

// Run serves the driver's services on its endpoint until ctx is done, then stops gracefully.
// A stale unix socket left by an earlier process is removed first.
func (d *Driver) Run(ctx context.Context) error {
	lis, unlink, err := listen(d.endpoint)
	if err != nil {
		return err
	}
	defer unlink()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(slices.Clone(d.interceptors), logAndMap)...))
	csi.RegisterIdentityServer(srv, d.identity)
	if d.controller != nil {
		csi.RegisterControllerServer(srv, d.controller)
	}
	if d.node != nil {
		csi.RegisterNodeServer(srv, d.node)
	}
	klog.InfoS("Serving CSI", "driver", d.name, "version", d.version, "mode", d.mode, "endpoint", d.endpoint)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	d.serving.Store(true)
	defer d.serving.Store(false)
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", d.endpoint, err)
	case <-ctx.Done():
		klog.InfoS("Stopping CSI server", "endpoint", d.endpoint)
		srv.GracefulStop()
		// Serve returns nil after GracefulStop; anything else is worth reporting.
		if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve %s: %w", d.endpoint, err)
		}
		return nil
	}
}

// Ready is a readiness check: nil while Run serves the endpoint, else an error saying so.
func (d *Driver) Ready() error {
	if !d.serving.Load() {
		return fmt.Errorf("CSI endpoint %s is not serving", d.endpoint)
	}
	return nil
}

// listen opens a listener for unix:///path or tcp://host:port, and returns with it what
// removes the socket file once the server stopped. A unix socket replaces the file at path
// (a stale socket, or a predecessor's that still serves: new connections reach this process
// from then on) and is removed only while path is still this socket: a successor that
// replaced it in turn (a plugin restarted beside this one) keeps its own (pkg/sockfile).
func listen(endpoint string) (net.Listener, func(), error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, nil, fmt.Errorf("endpoint %q: %w: %w", endpoint, ErrInvalidArgument, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Host // unix://relative.sock
		}
		lis, err := sockfile.Listen(path)
		if err != nil {
			return nil, nil, err
		}
		return lis, func() {
			if err := lis.Remove(); err != nil {
				klog.ErrorS(err, "CSI socket")
			}
		}, nil
	case "tcp":
		lis, err := net.Listen("tcp", u.Host)
		return lis, func() {}, err
	}
	return nil, nil, fmt.Errorf("endpoint %q: scheme must be unix or tcp: %w", endpoint, ErrInvalidArgument)
}
