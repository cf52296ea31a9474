package driver

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// kubeletDial connects to a registration socket as the kubelet's pluginwatcher does
// (pkg/kubelet/pluginmanager/operationexecutor: an insecure gRPC connection over a unix
// dialer, bounded by a timeout) and returns the Registration client.
func kubeletDial(t *testing.T, path string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

// waitSocket waits until path is a unix socket.
func waitSocket(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no registration socket at %s after 10 s", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startRegistration runs r until the returned stop is called; stop returns Run's error.
func startRegistration(t *testing.T, r *Registration) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	var err error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = errors.New("Run still running 10 s after ctx ended")
			}
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// TestRegistrationAsTheKubelet plays the kubelet against the registration socket: the socket
// appears only once the driver is ready (replacing a stale one), GetInfo gives what the
// kubelet's CSI handler validates (type CSIPlugin, the driver's name, the host path of the
// CSI endpoint, a supported 1.x version), a refused registration is logged and the socket
// keeps serving, and stopping removes the socket (the kubelet then deregisters the driver).
func TestRegistrationAsTheKubelet(t *testing.T) {
	dir := t.TempDir()
	r := &Registration{DriverName: v1alpha1.DriverName, Endpoint: "/var/lib/kubelet/plugins/raid10.csi.io/csi.sock", Dir: dir}
	path := filepath.Join(dir, "raid10.csi.io-reg.sock")
	if r.SocketPath() != path {
		t.Fatalf("socket %s, want %s", r.SocketPath(), path)
	}
	// A socket file left by a crashed process.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	r.Ready = func() error {
		if !ready.Load() {
			return errors.New("CSI endpoint not serving yet")
		}
		return nil
	}
	stop := startRegistration(t, r)
	time.Sleep(300 * time.Millisecond)
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket != 0 {
		t.Fatalf("the socket was made before the driver was ready: %v %v", fi, err)
	}
	ready.Store(true)
	waitSocket(t, path)

	c := kubeletDial(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := c.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != "raid10.csi.io" ||
		info.GetEndpoint() != "/var/lib/kubelet/plugins/raid10.csi.io/csi.sock" {
		t.Fatalf("GetInfo = %v", info)
	}
	if !hasCSIv1(info.GetSupportedVersions()) {
		t.Fatalf("supported versions %v: the kubelet takes a CSI plugin only with a 1.x", info.GetSupportedVersions())
	}
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false,
		Error: "plugin registration failed: NodeGetInfo: connection refused"}); err != nil {
		t.Fatalf("NotifyRegistrationStatus(false): %v", err)
	}
	// Still serving: the kubelet retries.
	if _, err := c.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		t.Fatalf("GetInfo after a refused registration: %v", err)
	}
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus(true): %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("registration socket left after stop: %v", err)
	}
}

// hasCSIv1 reports whether one of versions is a 1.x, as the kubelet's CSI plugin handler
// requires (highestSupportedVersion).
func hasCSIv1(versions []string) bool {
	for _, v := range versions {
		major, _, _ := strings.Cut(strings.TrimPrefix(v, "v"), ".")
		if n, err := strconv.Atoi(major); err == nil && n == 1 {
			return true
		}
	}
	return false
}

// TestRegistrationKeepsSuccessorSocket: a new plugin process started beside the old one
// replaces the socket; the old one, stopping afterwards, must not remove the new one's
// (the kubelet would deregister the driver under the running successor).
func TestRegistrationKeepsSuccessorSocket(t *testing.T) {
	dir := t.TempDir()
	old := &Registration{DriverName: "raid10.csi.io", Endpoint: "/csi/old.sock", Dir: dir}
	stopOld := startRegistration(t, old)
	waitSocket(t, old.SocketPath())
	first, err := os.Stat(old.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	succ := &Registration{DriverName: "raid10.csi.io", Endpoint: "/csi/new.sock", Dir: dir}
	startRegistration(t, succ)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if fi, err := os.Stat(old.SocketPath()); err == nil && !os.SameFile(fi, first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the successor did not replace the socket")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stopOld(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := kubeletDial(t, succ.SocketPath()).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil || info.GetEndpoint() != "/csi/new.sock" {
		t.Fatalf("the successor's socket after the old process stopped: %v, %v", info, err)
	}
}

// TestRegistrationBadInput: every field is checked before anything is made, and a missing
// registration directory is an error naming it.
func TestRegistrationBadInput(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		r    Registration
		want string
	}{
		{"no driver name", Registration{Endpoint: "/csi/csi.sock", Dir: dir}, "driver name"},
		{"relative endpoint", Registration{DriverName: "d", Endpoint: "csi.sock", Dir: dir}, "CSI endpoint"},
		{"relative directory", Registration{DriverName: "d", Endpoint: "/csi/csi.sock", Dir: "plugins_registry"}, "directory"},
		{"missing directory", Registration{DriverName: "d", Endpoint: "/csi/csi.sock", Dir: filepath.Join(dir, "nope")}, "plugins_registry"},
		{"directory is a file", Registration{DriverName: "d", Endpoint: "/csi/csi.sock", Dir: file}, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := tc.r.Run(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error naming %q", err, tc.want)
			}
			if tc.r.Validate() != nil && status.Code(toStatus(err)) != codes.InvalidArgument {
				t.Fatalf("Run: %v, want InvalidArgument", err)
			}
		})
	}
}
