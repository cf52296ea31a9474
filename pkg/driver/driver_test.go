package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestDriverKeepsSuccessorSocket: a plugin process started beside the one serving (a surge
// update's new pod) replaces the CSI socket with its own; the old process, stopping
// afterwards, must leave it (the kubelet would find no endpoint under the running
// successor), and the successor removes its own when it stops.
func TestDriverKeepsSuccessorSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	run := func(version string) (stop func()) {
		t.Helper()
		d, err := NewDriver(WithMode(ModeController), WithEndpoint("unix://"+sock), WithVersion(version),
			WithVolumeStore(NewKubeStore(fakeClient(t))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		waitFor(t, func() bool { return d.Ready() == nil })
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("driver %s Run: %v", version, err)
			}
		}
	}
	version := func() string {
		t.Helper()
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		if err != nil {
			t.Fatalf("GetPluginInfo on %s: %v", sock, err)
		}
		return info.GetVendorVersion()
	}

	stopOld := run("old")
	if v := version(); v != "old" {
		t.Fatalf("the first process answers as %q", v)
	}
	stopNew := run("new")
	if v := version(); v != "new" {
		t.Fatalf("after the successor started, the socket answers as %q, want new", v)
	}
	stopOld()
	if v := version(); v != "new" {
		t.Fatalf("after the old process stopped, the socket answers as %q, want new", v)
	}
	stopNew()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the successor left its socket behind: %v", err)
	}
}
