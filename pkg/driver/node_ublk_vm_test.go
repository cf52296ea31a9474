package driver

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/ublk"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestNodeUblkVM boots the newest kernel of the harness (7.3: ublk_drv with UPDATE_SIZE)
// and runs TestNodeUblkInGuest, TestNodeUblkGrowInGuest and TestNodeUblkCryptInGuest there.
// (The 6.12 kernel's ublk runs under the driver in test/sanity and cmd/raid10-csi's restart
// tests.)
func TestNodeUblkVM(t *testing.T) {
	vm.HostHalf(t)
	vm.RunGoTestOpts(t, vm.Options{Timeout: 7 * time.Minute, Memory: 2048,
		KernelSeries: vm.NewestKernelSeries,
		Modules:      append(slices.Clone(vm.DefaultModules), "ublk_drv", "dm_crypt", "xts", "algif_skcipher"),
		Tests:        []string{"TestNodeUblkInGuest", "TestNodeUblkGrowInGuest", "TestNodeUblkCryptInGuest"}},
		".", "-test.run=^TestNodeUblk(Grow|Crypt)?InGuest$", "-test.v", "-test.timeout=6m")
}

// TestNodeUblkCryptInGuest is an encrypted volume over the ublk frontend (issue 27: "both
// frontends"): staged with encrypted: "true", a key and frontend ublk, the LUKS2 header goes
// on /dev/ublkbN and ext4 on the mapping over it; a file of a marked pattern written and
// synced, the volume unstaged (mapping closed, device deleted), the pool's disks read raw
// hold the marker nowhere, while a plain volume's marker written the same way over ublk is
// on both copies (the scan's control); staged again with the key, the file reads back.
func TestNodeUblkCryptInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestNodeUblkVM")
	testenv.RequireTools(t, "cryptsetup", "blkid", "mkfs.ext4")
	dir := t.TempDir()
	ctx := context.Background()
	p, cfg := openFilePool(t, 192<<20)
	for _, v := range []string{"vol-enc", "vol-plain"} {
		if _, err := p.CreateVolume(v, 48<<20, pool.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, _, att := guestAttacher(t, p, dir, kernel.Options{Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	defer att.Close(context.Background())
	if err := att.EnableUblk(ctx, attach.FrontendUblk, filepath.Join(dir, attach.UblkStateFile)); err != nil {
		t.Fatal(err)
	}
	ns := guestCryptNodeServer(t, att)
	key := map[string]string{SecretKeyField: "correct horse battery staple"}
	stage := func(id, staging string, vc, secrets map[string]string) {
		t.Helper()
		start := time.Now()
		if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: mountCap("ext4"), VolumeContext: vc, Secrets: secrets}); err != nil {
			t.Fatalf("stage %s: %v", id, err)
		}
		t.Logf("stage %s on %s (%s)", id, att.Device(id), time.Since(start).Round(time.Millisecond))
		if dev := att.Device(id); !strings.HasPrefix(dev, "/dev/ublkb") {
			t.Fatalf("%s staged on %q, want /dev/ublkbN", id, dev)
		}
	}
	unstage := func(id, staging string) {
		t.Helper()
		if _, err := ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("unstage %s: %v", id, err)
		}
	}

	plain := plainPattern("RAID10-CSI PLAINTEXT OVER UBLK")
	stPlain := filepath.Join(dir, "st-plain")
	stage("vol-plain", stPlain, map[string]string{ParamFrontend: "ublk"}, nil)
	if err := writeSync(filepath.Join(stPlain, "f"), bytes.Repeat(plain, 512)); err != nil {
		t.Fatal(err)
	}
	unstage("vol-plain", stPlain)
	if n, want := onDisks(t, cfg, plain[:64]), 2*512*(4096/64); n < want {
		t.Fatalf("control: the plain marker is found %d times on the disks, want at least %d (two copies)", n, want)
	}

	secret := plainPattern("RAID10-CSI SECRET OVER UBLK")
	stEnc := filepath.Join(dir, "st-enc")
	vc := map[string]string{ParamFrontend: "ublk", ParamEncrypted: "true"}
	stage("vol-enc", stEnc, vc, key)
	dev := att.Device("vol-enc")
	if fs := blkid(t, dev); fs != "crypto_LUKS" {
		t.Fatalf("%s holds %q, want crypto_LUKS", dev, fs)
	}
	mapper := ns.cryptsetup().Path(crypt.MapperName("vol-enc"))
	if fs := blkid(t, mapper); fs != "ext4" {
		t.Fatalf("%s holds %q, want ext4", mapper, fs)
	}
	if err := writeSync(filepath.Join(stEnc, "f"), bytes.Repeat(secret, 1024)); err != nil {
		t.Fatal(err)
	}
	unstage("vol-enc", stEnc)
	if _, err := os.Stat(mapper); !os.IsNotExist(err) {
		t.Fatalf("%s after unstage: %v, want it gone", mapper, err)
	}
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Fatalf("%s after unstage: %v, want the ublk device deleted", dev, err)
	}
	if n := onDisks(t, cfg, secret[:64]); n != 0 {
		t.Fatalf("the encrypted volume's plaintext marker is found %d times on the raw disks", n)
	}
	stage("vol-enc", stEnc, vc, key)
	got, err := os.ReadFile(filepath.Join(stEnc, "f"))
	if err != nil || !bytes.Equal(got, bytes.Repeat(secret, 1024)) {
		t.Fatalf("read back through the re-opened mapping over ublk: %d bytes, %v", len(got), err)
	}
	unstage("vol-enc", stEnc)
}

// orphanUblk adds a ublk device of ours over a 16 MiB file at path and leaves it with no
// server and no record, as a crash between adding and recording would; with hold, the test
// keeps its block device open. When t ends the hold is closed and the device deleted.
func orphanUblk(t *testing.T, ctx context.Context, path string, hold bool) *ublk.Device {
	t.Helper()
	fb, err := nbd.OpenFileBackend(path, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fb.Close() })
	d, err := ublk.Create(ctx, fb, ublk.Options{Queues: 1, Depth: 4})
	if err != nil {
		t.Fatal(err)
	}
	var f *os.File
	if hold {
		if f, err = os.Open(d.Path()); err != nil {
			t.Fatal(err)
		}
	}
	d.Detach()
	t.Cleanup(func() {
		if f != nil {
			_ = f.Close()
		}
		_ = ublk.Delete(context.Background(), d.ID())
	})
	return d
}

// TestNodeUblkInGuest drives the node service with a StorageClass that asks for ublk (and
// checks auto's choice against the kernel's ublk features): the
// volume is staged on /dev/ublkbN with ext4 while an NBD volume of the same pool stays on
// /dev/nbdX; a writer appends and fsyncs records while the plugin's data path restarts (the
// old attacher stops serving, a new one recovers the device from its records) and sees no
// error; a ublk device of ours that no record names is deleted as an orphan (one held open is
// stopped and left, the restart does not wait for it); unstage deletes the device and its
// record.
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
	// auto: ublk where the kernel's ublk_drv has all a volume needs (7.3), else NBD (6.12).
	feat, err := ublk.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantDef := attach.FrontendNBD
	if feat.Has(ublk.Required) {
		wantDef = attach.FrontendUblk
	}
	def, err := attach.ResolveFrontend(attach.FrontendAuto)
	if err != nil || def != wantDef {
		t.Fatalf("auto resolves to %q (%v), want %s with ublk features %s", def, err, wantDef, feat)
	}
	t.Logf("auto resolves to %s (ublk features %s)", def, feat)
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
		VolumeCapability: blockCap(), VolumeContext: map[string]string{ParamFrontend: "nbd"}}); err != nil {
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

	// An orphan: a device of ours that no record names (a crash between adding and recording);
	// and a second one that something holds open: the kernel's DEL_DEV waits for it to be
	// closed, and the restart must not wait with it (it is stopped and left).
	orphan := orphanUblk(t, ctx, filepath.Join(dir, "orphan.img"), false)
	held := orphanUblk(t, ctx, filepath.Join(dir, "held.img"), true)

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
	if info, err := ublk.GetInfo(ctx, held.ID()); err != nil || info.State == ublk.StateLive {
		t.Errorf("orphan %s held open: %+v, %v after the restart; want it there, stopped", held.Path(), info, err)
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

// TestNodeUblkGrowInGuest is online expansion over ublk through the node service, on a
// kernel with UPDATE_SIZE: a volume staged over ublk with ext4 and published, a file
// written; the pool grows the volume (the node agent's step), then NodeExpandVolume grows
// the served device live (attach's Expand: UPDATE_SIZE) and ext4 on it (resize2fs). The
// device and df see the new size, a file larger than the old filesystem fits, both read
// back after the caches are dropped; the frontend reported for the status names
// UPDATE_SIZE.
func TestNodeUblkGrowInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestNodeUblkVM")
	const id, from, to = "vol-grow", 64 << 20, 192 << 20
	dir := t.TempDir()
	ctx := context.Background()
	p, _ := openFilePool(t, 256<<20)
	if _, err := p.CreateVolume(id, from, pool.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, att := guestAttacher(t, p, dir, kernel.Options{Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	defer att.Close(context.Background())
	if err := att.EnableUblk(ctx, attach.FrontendNBD, filepath.Join(dir, attach.UblkStateFile)); err != nil {
		t.Fatal(err)
	}
	ns := guestNodeServer(t, att)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pod")
	_, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: mountCap("ext4"), VolumeContext: map[string]string{ParamFrontend: "ublk"}})
	must("stage", err)
	_, err = ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap("ext4")})
	must("publish", err)
	dev := att.Device(id)
	if !strings.HasPrefix(dev, "/dev/ublkb") {
		t.Fatalf("staged on %q, want /dev/ublkbN", dev)
	}
	if fe := att.Frontend(id); !strings.HasPrefix(fe, "ublk (") || !strings.Contains(fe, "UPDATE_SIZE") {
		t.Errorf("frontend for the status %q, want ublk with UPDATE_SIZE", fe)
	} else {
		t.Logf("status frontend: %s", fe)
	}
	before := bytes.Repeat([]byte("grow over ublk "), 1<<20) // 15 MiB
	must("write before", writeSync(filepath.Join(target, "before"), before))
	df0 := dfSize(t, target)

	_, err = p.ExpandVolume(id, to)
	must("pool expand", err)
	if n := vm.BlockSize(t, dev); n != from {
		t.Fatalf("%s has %d bytes before NodeExpandVolume, want still %d", dev, n, from)
	}
	start := time.Now()
	r, err := ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, StagingTargetPath: staging,
		VolumeCapability: mountCap("ext4"), CapacityRange: &csi.CapacityRange{RequiredBytes: to}})
	must("NodeExpandVolume", err)
	t.Logf("NodeExpandVolume over ublk %d -> %d bytes took %s", from, to, time.Since(start).Round(time.Millisecond))
	if r.GetCapacityBytes() != to || vm.BlockSize(t, dev) != to {
		t.Fatalf("after NodeExpandVolume: reported %d bytes, %s has %d; want %d", r.GetCapacityBytes(), dev, vm.BlockSize(t, dev), to)
	}
	df1 := dfSize(t, target)
	t.Logf("df ext4: %d -> %d bytes", df0, df1)
	if df1-df0 < (to-from)*9/10 {
		t.Fatalf("df grew by %d bytes, the device by %d", df1-df0, to-from)
	}
	after := bytes.Repeat([]byte("written after the growth "), 3<<20) // 75 MiB: more than the old filesystem
	must("fill the grown filesystem", writeSync(filepath.Join(target, "after"), after))
	must("drop caches", os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200))
	for name, want := range map[string][]byte{"before": before, "after": after} {
		if got, err := os.ReadFile(filepath.Join(staging, name)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s reads back wrong after the growth (%v)", name, err)
		}
	}
	_, err = ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	must("unpublish", err)
	_, err = ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	must("unstage", err)
}
