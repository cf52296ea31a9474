package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// Where TestAdminSocketVM tells the guest half its binaries are.
const (
	pluginBinEnv  = "RAID10_TEST_PLUGIN"
	kubectlBinEnv = "RAID10_TEST_KUBECTL_RAID10"
)

// TestAdminSocketVM builds the plugin and kubectl-raid10 and runs TestAdminSocketInGuest in
// the VM (the plugin's node side needs the kernel's nbd to start, even with nothing attached).
func TestAdminSocketVM(t *testing.T) {
	vm.HostHalf(t)
	bins := filepath.Join(vm.CacheDir(), "bin")
	if err := os.MkdirAll(bins, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(bins, "admin-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, b := range []string{"raid10-csi", "kubectl-raid10"} {
		out, err := vm.GoCommand(context.Background(), "build", "-o", filepath.Join(dir, b), "github.com/raid10-csi/raid10-csi/cmd/"+b).CombinedOutput()
		if err != nil {
			t.Fatalf("go build cmd/%s: %v\n%s", b, err, out)
		}
	}
	res := vm.RunGoTestOpts(t, vm.Options{Timeout: 5 * time.Minute, Memory: 1024, CPUs: 1,
		Env: []string{pluginBinEnv + "=" + filepath.Join(dir, "raid10-csi"), kubectlBinEnv + "=" + filepath.Join(dir, "kubectl-raid10")}},
		".", "-test.run=^TestAdminSocketInGuest$", "-test.v", "-test.timeout=4m")
	t.Logf("VM run: boot %s, total %s", res.Boot.Round(time.Second), res.Duration.Round(time.Second))
}

// TestAdminSocketInGuest runs the plugin as its own process in --mode=all on four file
// disks and works its pool with kubectl-raid10 --local through the admin socket in
// --state-dir (no --pool-config: nothing may open the disks a second time): status shows the
// disks Active (not Refused as in use), a volume made through CSI is listed, a disk fails,
// is replaced and the volume rebuilds until `wait` sees it Healthy; volume writes are
// refused (they belong to CSI here); a scrub runs to its end; SIGTERM removes the socket.
func TestAdminSocketInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestAdminSocketVM")
	plugin, kubectl := os.Getenv(pluginBinEnv), os.Getenv(kubectlBinEnv)
	if plugin == "" || kubectl == "" {
		t.Fatalf("%s and %s must name the binaries", pluginBinEnv, kubectlBinEnv)
	}
	dir := t.TempDir()
	var cfg pool.Config
	for _, p := range vm.SparseFiles(t, dir, "disk", 4, 128<<20) {
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: p})
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "pool.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "csi.sock")
	cmd := exec.Command(plugin, "--mode=all", "--node-id=vm-node", "--endpoint=unix://"+sock,
		"--pool-config="+filepath.Join(dir, "pool.json"), "--state-dir="+state, "--metrics-address=")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("plugin log:\n%s", logs.String())
		}
	}()
	adminSock := admin.Socket(state)
	for deadline := time.Now().Add(time.Minute); ; {
		if c, err := admin.Dial(context.Background(), adminSock); err == nil {
			_ = c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("plugin exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no admin socket after a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if fi, err := os.Stat(adminSock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin socket: %v, mode %v", err, fi.Mode())
	}

	// kubectl-raid10 --local finds the plugin's socket in --state-dir.
	k := func(wantOK bool, args ...string) string {
		t.Helper()
		c := exec.Command(kubectl, append([]string{"--local", "--run-dir=" + filepath.Join(dir, "no-agent"), "--state-dir=" + state}, args...)...)
		c.Env = append(os.Environ(), "RAID10_POOL_CONFIG=")
		out, err := c.CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("kubectl-raid10 %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := k(true, "status")
	if strings.Contains(out, "Refused") || strings.Count(out, "Active") != 4 {
		t.Fatalf("status:\n%s", out)
	}

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	cv, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          "pvc-admin",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := cv.GetVolume().GetVolumeId()
	if out := k(true, "volumes", id); !strings.Contains(out, "Healthy") {
		t.Fatalf("volumes %s:\n%s", id, out)
	}
	if out := k(false, "create", "other", "32Mi"); !strings.Contains(out, "through CSI") {
		t.Fatalf("create through the plugin's socket:\n%s", out)
	}

	k(true, "disk", "fail", filepath.Join(dir, "disk1.img"))
	if out := k(true, "volumes", id); !strings.Contains(out, "Degraded") {
		t.Fatalf("after disk fail:\n%s", out)
	}
	repl := filepath.Join(dir, "repl.img")
	if err := os.WriteFile(repl, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(repl, 128<<20); err != nil {
		t.Fatal(err)
	}
	k(true, "disk", "replace", filepath.Join(dir, "disk1.img"), repl)
	if out := k(true, "wait", id, "--for", "Healthy", "--timeout", "2m"); !strings.Contains(out, "Healthy, 4/4") {
		t.Fatalf("wait:\n%s", out)
	}
	if out := k(true, "scrub", id, "--follow"); !strings.Contains(out, id+": check Done 100.0%") || !strings.Contains(out, "0 mismatches") {
		t.Fatalf("scrub --follow through the plugin:\n%s", out)
	}
	var disks []pool.DiskInfo
	if err := json.Unmarshal([]byte(k(true, "disks", "-o", "json")), &disks); err != nil {
		t.Fatal(err)
	}
	for _, d := range disks {
		if d.Path == repl && d.Status != pool.StatusActive {
			t.Fatalf("replacement disk: %+v", d)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("plugin after SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("plugin still running a minute after SIGTERM")
	}
	if _, err := os.Stat(adminSock); !os.IsNotExist(err) {
		t.Fatalf("admin socket after the plugin stopped: %v", err)
	}
}
