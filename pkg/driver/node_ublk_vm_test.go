package driver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/ublk"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestNodeUblkVM boots the 6.12 kernel (ublk_drv) and runs TestNodeUblkInGuest there.
func TestNodeUblkVM(t *testing.T) {
	vm.HostHalf(t)
	vm.RunGoTestOpts(t, vm.Options{Timeout: 5 * time.Minute, Memory: 2048,
		KernelSeries: vm.UblkKernelSeries, Modules: append(slices.Clone(vm.DefaultModules), "ublk_drv"),
		Tests: []string{"TestNodeUblkInGuest"}},
		".", "-test.run=^TestNodeUblkInGuest$", "-test.v", "-test.timeout=4m")
}

// TestNodeUblkInGuest drives the node service with a StorageClass that asks for ublk: the
// volume is staged on /dev/ublkbN with ext4 while an NBD volume of the same pool stays on
// /dev/nbdX; a writer appends and fsyncs records while the plugin's data path restarts (the
// old attacher stops serving, a new one recovers the device from its records) and sees no
// error; a ublk device of ours that no record names is deleted as an orphan; unstage deletes
// the device and its record.
func TestNodeUblkInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestNodeUblkVM")
	dir := t.TempDir()
	ctx := context.Background()
	p, _ := openFilePool(t, 256<<20)
	for _, v := range []string{"vol-ublk", "vol-nbd"} {
		if _, err := p.CreateVolume(v, 64<<20, pool.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ublkPath := filepath.Join(dir, attach.UblkStateFile)
	kopts := kernel.Options{Timeout: 10 * time.Second, DeadConnTimeout: 60 * time.Second}
	_, _, att := guestAttacher(t, p, dir, kopts)
	statePath := filepath.Join(dir, nbdStateFile)
	def, err := attach.ResolveFrontend(attach.FrontendAuto)
	if err != nil || def != attach.FrontendNBD {
		t.Fatalf("auto resolves to %q (%v), want nbd", def, err)
	}
	if err := att.EnableUblk(ctx, def, ublkPath); err != nil {
		t.Fatal(err)
	}
	ns := guestNodeServer(t, att)
	staging := filepath.Join(dir, "staging")
	if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-ublk", StagingTargetPath: staging,
		VolumeCapability: mountCap("ext4"), VolumeContext: map[string]string{ParamFrontend: "ublk"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-nbd", StagingTargetPath: filepath.Join(dir, "staging-nbd"),
		VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	dev := att.Device("vol-ublk")
	if !strings.HasPrefix(dev, "/dev/ublkb") || !strings.HasPrefix(att.Device("vol-nbd"), "/dev/nbd") {
		t.Fatalf("devices %q and %q, want /dev/ublkbN and /dev/nbdX", dev, att.Device("vol-nbd"))
	}
	if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: staging,
		VolumeCapability: mountCap("ext4"), VolumeContext: map[string]string{ParamFrontend: "iscsi"}}); err == nil {
		t.Fatal("frontend iscsi accepted")
	}

	// An orphan: a device of ours that no record names (a crash between adding and recording).
	fb, err := nbd.OpenFileBackend(filepath.Join(dir, "orphan.img"), 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	orphan, err := ublk.Create(ctx, fb, ublk.Options{Queues: 1, Depth: 4})
	if err != nil {
		t.Fatal(err)
	}
	orphan.Detach()

	w := startRecordWriter(filepath.Join(staging, "log"))
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	att.Close(ctx) // the "old process" stops serving; the devices stay, their I/O queued
	time.Sleep(500 * time.Millisecond)
	att2, err := attach.OpenPoolAttacher(ctx, p, statePath, kopts)
	if err != nil {
		t.Fatal(err)
	}
	defer att2.Close(context.Background())
	if err := att2.EnableUblk(ctx, def, ublkPath); err != nil {
		t.Fatal(err)
	}
	if got := att2.Device("vol-ublk"); got != dev {
		t.Fatalf("after the restart vol-ublk is on %q, was %s", got, dev)
	}
	t.Logf("restart took %s", time.Since(start).Round(time.Millisecond))
	if _, err := ublk.GetInfo(ctx, orphan.ID()); err == nil {
		t.Errorf("orphan %s still there after the restart", orphan.Path())
	}
	time.Sleep(500 * time.Millisecond)
	w.stopAndVerify(t)
	if out, _ := exec.Command("dmesg").Output(); strings.Contains(string(out), "WARNING:") {
		t.Errorf("kernel warned:\n%s", out)
	}
	if err := att2.Ready(); err != nil {
		t.Errorf("Ready with a ublk volume: %v", err)
	}
	if st := att2.IOStats()["vol-ublk"]; st.Write.Requests == 0 || st.Write.Bytes == 0 {
		t.Errorf("IOStats of the ublk volume: %+v, want its writes counted", st.Write)
	}
	if _, err := att2.Expand(ctx, "vol-ublk"); err != nil {
		t.Errorf("Expand of an unchanged volume over ublk: %v", err)
	}

	ns2 := guestNodeServer(t, att2)
	if _, err := ns2.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-ublk", StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("%s still there after unstage: %v", dev, err)
	}
	if b, err := os.ReadFile(ublkPath); err != nil || strings.Contains(string(b), `"vol-ublk"`) {
		t.Errorf("ublk records after unstage: %q, %v: want vol-ublk gone", b, err)
	}
	if _, err := ns2.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-nbd", StagingTargetPath: filepath.Join(dir, "staging-nbd")}); err != nil {
		t.Fatal(err)
	}
}
