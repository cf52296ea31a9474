package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/raid10-csi/raid10-csi/pkg/sockfile"
)

// DefaultRegistrationDir is the kubelet's plugin registration directory (its pluginwatcher
// watches it for sockets) under the default kubelet root.
const DefaultRegistrationDir = "/var/lib/kubelet/plugins_registry"

// supportedCSIVersions are the CSI versions reported to the kubelet, which takes a plugin
// only when one of them is a 1.x (as node-driver-registrar reports).
var supportedCSIVersions = []string{"1.0.0"}

// Registration is the node plugin's side of the kubelet's plugin-registration protocol
// (k8s.io/kubelet pkg/apis/pluginregistration/v1), the job node-driver-registrar does as a
// sidecar: it serves the Registration service on a unix socket in the kubelet's
// plugins_registry directory. The kubelet's pluginwatcher sees the socket appear, calls
// GetInfo (type CSIPlugin, the driver's name, the CSI endpoint as the kubelet sees it),
// registers the driver (it calls NodeGetInfo on that endpoint) and reports the outcome with
// NotifyRegistrationStatus. Removing the socket deregisters the driver.
type Registration struct {
	registerapi.UnimplementedRegistrationServer

	// DriverName is the CSI driver's name (raid10.csi.io).
	DriverName string
	// Endpoint is the CSI socket's path on the host, as the kubelet dials it (e.g.
	// /var/lib/kubelet/plugins/raid10.csi.io/csi.sock): not the path inside a container.
	Endpoint string
	// Dir is the registration directory the socket is made in (DefaultRegistrationDir).
	Dir string
	// Ready, when set, is polled (every 200 ms) before the socket is made, so the kubelet
	// never finds a driver whose CSI endpoint does not answer yet (Driver.Ready).
	Ready func() error
}

var _ registerapi.RegistrationServer = (*Registration)(nil)

// SocketPath is the registration socket: <Dir>/<DriverName>-reg.sock, as
// node-driver-registrar names it.
func (r *Registration) SocketPath() string {
	return filepath.Join(r.Dir, r.DriverName+"-reg.sock")
}

// Validate reports the first missing or malformed field.
func (r *Registration) Validate() error {
	switch {
	case r.DriverName == "":
		return fmt.Errorf("registration: driver name: must be set: %w", ErrInvalidArgument)
	case !filepath.IsAbs(r.Endpoint):
		return fmt.Errorf("registration: CSI endpoint %q: must be an absolute path on the host: %w", r.Endpoint, ErrInvalidArgument)
	case !filepath.IsAbs(r.Dir):
		return fmt.Errorf("registration: directory %q: must be an absolute path: %w", r.Dir, ErrInvalidArgument)
	}
	return nil
}

// GetInfo tells the kubelet what this plugin is and where its CSI endpoint is.
func (r *Registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	klog.V(2).InfoS("Kubelet asked for the plugin's registration info", "driver", r.DriverName, "endpoint", r.Endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.DriverName,
		Endpoint:          r.Endpoint,
		SupportedVersions: supportedCSIVersions,
	}, nil
}

// NotifyRegistrationStatus logs the kubelet's verdict. A refusal is logged as an error and
// the socket keeps serving: the kubelet retries while the socket exists, and what it refused
// for (e.g. the CSI endpoint not answering NodeGetInfo) may be passing.
func (r *Registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		klog.InfoS("Registered with the kubelet", "driver", r.DriverName, "endpoint", r.Endpoint)
	} else {
		klog.ErrorS(errors.New(st.GetError()), "The kubelet refused the registration", "driver", r.DriverName, "endpoint", r.Endpoint)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Run waits for Ready, makes the socket (replacing one a crashed process left) and serves
// until ctx is done; then it removes the socket, which deregisters the driver, unless
// another process has replaced it meanwhile.
func (r *Registration) Run(ctx context.Context) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.Ready != nil {
		for err := r.Ready(); err != nil; err = r.Ready() {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	fi, err := os.Stat(r.Dir)
	if err != nil {
		return fmt.Errorf("registration directory (the kubelet's plugins_registry): %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("registration directory %s: not a directory", r.Dir)
	}
	path := r.SocketPath()
	// A successor process (a restart beside this one) replaces the socket with its own at
	// the same path: this one must then leave it alone (pkg/sockfile).
	lis, err := sockfile.Listen(path)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	remove := func() {
		if err := lis.Remove(); err != nil {
			klog.ErrorS(err, "Registration socket")
		}
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	klog.InfoS("Serving kubelet plugin registration", "socket", path, "driver", r.DriverName, "endpoint", r.Endpoint)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case <-ctx.Done():
		srv.Stop()
		if err := <-errc; err != nil { // after Stop, Serve only reports that it stopped
			klog.V(4).InfoS("registration server stopped", "err", err)
		}
		remove()
		return nil
	case err := <-errc:
		remove()
		return fmt.Errorf("registration server: %w", err)
	}
}
