package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestNodeVM boots the VM (a real kernel with nbd, ext4, xfs, dm-crypt) and runs every
// TestNodeInGuest* there.
func TestNodeVM(t *testing.T) {
	vm.HostHalf(t)
	start := time.Now()
	// dm_crypt, xts and algif_skcipher: the encrypted volumes of TestNodeInGuestCrypt
	// (cryptsetup uses the kernel's crypto API for its keyslots, dm-crypt for the data).
	// TestModifyVolumeInGuest shares the boot (it had one of its own, about 20 s). The guest
	// took up to 5 min on a host at load 16 (TestNodeInGuestCrypt 130 s with its rotation).
	res := vm.RunGoTestOpts(t, vm.Options{Timeout: 12 * time.Minute, Memory: 2048,
		Modules: append(append([]string{}, vm.DefaultModules...), "dm_crypt", "xts", "algif_skcipher"),
		Tests: []string{"TestNodeInGuest", "TestNodeInGuestExpand", "TestNodeInGuestRestart", "TestNodeInGuestCrypt",
			"TestModifyVolumeInGuest"}},
		".", "-test.run=^(TestNodeInGuest|TestModifyVolumeInGuest$)", "-test.v", "-test.timeout=11m")
	t.Logf("VM run: boot %s, total %s (with the build: %s)", res.Boot.Round(time.Second),
		res.Duration.Round(time.Second), time.Since(start).Round(time.Second))
}

// TestNodeInGuest drives the real node service, over gRPC on a unix socket, on a pool of four
// file disks: real /dev/nbdX through netlink, real mkfs.ext4 and mkfs.xfs, real mounts.
func TestNodeInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestNodeVM")
	dir := t.TempDir()
	p, cfg := openFilePool(t, 512<<20)
	for name, size := range map[string]uint64{"vol-ext4": 128 << 20, "vol-xfs": 320 << 20, "vol-block": 64 << 20} {
		if _, err := p.CreateVolume(name, size, pool.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	nl, state, att := guestAttacher(t, p, dir, kernel.Options{Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	defer att.Close(context.Background())
	ns, err := NewNodeServer(NodeConfig{NodeID: "vm-node", Attacher: att, Mounter: mount.New(""), Exec: utilexec.New(), Pool: p})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(logAndMap))
	csi.RegisterNodeServer(srv, ns)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := csi.NewNodeClient(conn)
	ctx := context.Background()

	step := func(name string, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s (%s)", name, time.Since(start).Round(time.Millisecond))
	}
	stage := func(id, staging string, vc *csi.VolumeCapability) error {
		_, err := c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: vc})
		return err
	}
	unstage := func(id, staging string) error {
		_, err := c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	}
	publish := func(id, staging, target string, vc *csi.VolumeCapability, ro bool) error {
		_, err := c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: vc, Readonly: ro})
		return err
	}
	unpublish := func(id, target string) error {
		_, err := c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		return err
	}
	deviceOf := func(id string) string {
		t.Helper()
		rec, ok := state.Get(id)
		if !ok {
			t.Fatalf("%s: no device recorded", id)
		}
		return kernel.DevicePath(rec.Index)
	}
	detached := func(id string, dev string) error {
		if _, ok := state.Get(id); ok {
			return errors.New("still recorded in the state file")
		}
		idx, _ := strconv.Atoi(strings.TrimPrefix(dev, "/dev/nbd"))
		st, err := nl.Status(idx)
		if err != nil {
			return err
		}
		if len(st) == 1 && st[0].Connected {
			return errors.New(dev + " still connected")
		}
		return nil
	}

	// ext4: stage twice (idempotent), publish, write through the bind, read back.
	st1, tg1 := filepath.Join(dir, "staging-ext4"), filepath.Join(dir, "pod1", "mount")
	step("stage ext4", func() error { return stage("vol-ext4", st1, mountCap("ext4")) })
	step("stage ext4 again", func() error { return stage("vol-ext4", st1, mountCap("ext4")) })
	dev1 := deviceOf("vol-ext4")
	if fs := blkid(t, dev1); fs != "ext4" {
		t.Fatalf("%s holds %q, want ext4", dev1, fs)
	}
	step("publish ext4", func() error { return publish("vol-ext4", st1, tg1, mountCap("ext4"), false) })
	data := bytes.Repeat([]byte("raid10-csi node test\n"), 1000)
	step("write through the bind", func() error { return writeSync(filepath.Join(tg1, "f"), data) })
	if got, err := os.ReadFile(filepath.Join(st1, "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back through the staging path: %v", err)
	}
	stats, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-ext4", VolumePath: tg1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats ext4: %v", stats)
	if len(stats.Usage) != 2 || stats.Usage[0].Total < 100<<20 || stats.Usage[0].Used <= 0 ||
		stats.Usage[1].Unit != csi.VolumeUsage_INODES || stats.Usage[1].Total <= 0 {
		t.Fatalf("stats %v", stats)
	}
	expand := func(id, path, staging string, vc *csi.VolumeCapability, want int64) error {
		r, err := c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: path,
			StagingTargetPath: staging, VolumeCapability: vc})
		if err == nil && r.GetCapacityBytes() != want {
			err = errors.New("capacity " + strconv.FormatInt(r.GetCapacityBytes(), 10))
		}
		return err
	}
	// At the same size the device is left as it is and resize2fs has nothing to do, but the
	// whole path runs (TestNodeInGuestExpand grows for real).
	step("expand ext4 (resize2fs)", func() error { return expand("vol-ext4", tg1, st1, mountCap("ext4"), 128<<20) })
	if err := unstage("vol-ext4", st1); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("unstage while published: %v, want FailedPrecondition", err)
	}
	// The staging path unmounted behind the driver's back while the pod's bind lives on:
	// unstage finds the bind in the mount table by the device's numbers, refuses naming it,
	// and the pod's writes and fsync go on (a detach here failed them with EIO).
	step("umount the staging path", func() error { return syscall.Unmount(st1, 0) })
	if err := unstage("vol-ext4", st1); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tg1) {
		t.Fatalf("unstage with the staging path unmounted and %s bound: %v, want FailedPrecondition naming it", tg1, err)
	}
	step("fsync through the bind after the refused unstage", func() error { return writeSync(filepath.Join(tg1, "h"), data) })
	step("unpublish ext4", func() error { return unpublish("vol-ext4", tg1) })
	step("unpublish ext4 again", func() error { return unpublish("vol-ext4", tg1) })
	step("unstage ext4", func() error { return unstage("vol-ext4", st1) })
	step("unstage ext4 again", func() error { return unstage("vol-ext4", st1) })
	step("ext4 device detached", func() error { return detached("vol-ext4", dev1) })

	// Staging again must not format again: the file is still there.
	step("restage ext4", func() error { return stage("vol-ext4", st1, mountCap("ext4")) })
	if got, err := os.ReadFile(filepath.Join(st1, "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file lost after restage (reformatted?): %v", err)
	}
	// Asking for xfs on the ext4 volume is refused, never reformatted.
	if err := stage("vol-ext4", filepath.Join(dir, "other"), mountCap("xfs")); err == nil {
		// The volume is attached and staged elsewhere already; mismatched fs must fail.
		t.Fatal("staging ext4 volume as xfs succeeded")
	}

	// Degraded: fail a disk; NodeGetVolumeHealth names the member down, on its disk.
	step("fail disk", func() error { return p.FailDisk(cfg.Disks[0].Path) })
	step("degraded health", func() error {
		deadline := time.Now().Add(5 * time.Second)
		for {
			r, err := c.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "vol-ext4", StagingTargetPath: st1})
			if err != nil {
				return err
			}
			if m := messageOf(r.GetVolumeHealth(), HealthReasonMemberDown); strings.Contains(m, cfg.Disks[0].Path) {
				t.Logf("health: %v", r.GetVolumeHealth())
				return nil
			}
			if time.Now().After(deadline) {
				return errors.New("no MemberDown entry naming " + cfg.Disks[0].Path + ": " + r.GetVolumeHealth().String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// I/O goes on, degraded.
	step("write degraded", func() error { return writeSync(filepath.Join(st1, "g"), data) })
	step("unstage ext4 (degraded)", func() error { return unstage("vol-ext4", st1) })

	// xfs, published read-only: writes fail with EROFS.
	st2, tg2 := filepath.Join(dir, "staging-xfs"), filepath.Join(dir, "pod2", "mount")
	step("stage xfs", func() error { return stage("vol-xfs", st2, mountCap("xfs")) })
	dev2 := deviceOf("vol-xfs")
	if fs := blkid(t, dev2); fs != "xfs" {
		t.Fatalf("%s holds %q, want xfs", dev2, fs)
	}
	step("publish xfs ro", func() error { return publish("vol-xfs", st2, tg2, mountCap("xfs"), true) })
	if err := os.WriteFile(filepath.Join(tg2, "f"), data, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to a read-only publish: %v, want EROFS", err)
	}
	step("expand xfs (xfs_growfs)", func() error { return expand("vol-xfs", tg2, st2, mountCap("xfs"), 320<<20) })
	// A clone carries its source's xfs UUID; staged beside the mounted source on the same
	// node it mounts (nouuid) and holds the source's file. Without nouuid the kernel refuses
	// it: "Filesystem has duplicate UUID" (Kubernetes' multiVolume spec "volume and restored
	// snapshot on the same node", xfs). The clone is 32 MiB larger than its source: the
	// stage grows the filesystem to the device (the provisioning spec "restoring snapshot to
	// larger size pvc": it kept the source's size before).
	step("write to the xfs staging mount", func() error { return writeSync(filepath.Join(st2, "f"), data) })
	if _, err := p.CreateVolume("vol-xfs-clone", 352<<20, pool.CreateOptions{Source: &pool.Source{Volume: "vol-xfs"}}); err != nil {
		t.Fatalf("clone vol-xfs: %v", err)
	}
	stc := filepath.Join(dir, "staging-xfs-clone")
	step("stage the larger xfs clone beside its source", func() error { return stage("vol-xfs-clone", stc, mountCap("xfs")) })
	if got, err := os.ReadFile(filepath.Join(stc, "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the clone's file: %d bytes, %v; want the source's %d bytes", len(got), err, len(data))
	}
	var srcFS, cloneFS unix.Statfs_t
	if err := unix.Statfs(st2, &srcFS); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(stc, &cloneFS); err != nil {
		t.Fatal(err)
	}
	if src, clone := srcFS.Blocks*uint64(srcFS.Bsize), cloneFS.Blocks*uint64(cloneFS.Bsize); clone < src+16<<20 {
		t.Fatalf("the 352 MiB clone's filesystem has %d bytes, its 320 MiB source's %d: not grown to its device at stage", clone, src)
	}
	step("unstage the xfs clone", func() error { return unstage("vol-xfs-clone", stc) })
	if err := p.DeleteVolume("vol-xfs-clone"); err != nil {
		t.Fatalf("delete the clone: %v", err)
	}
	step("unpublish xfs", func() error { return unpublish("vol-xfs", tg2) })
	step("unstage xfs", func() error { return unstage("vol-xfs", st2) })
	step("xfs device detached", func() error { return detached("vol-xfs", dev2) })

	// Block: the device node bound onto a file.
	st3, tg3 := filepath.Join(dir, "staging-block"), filepath.Join(dir, "pod3", "dev")
	step("stage block", func() error { return stage("vol-block", st3, blockCap()) })
	dev3 := deviceOf("vol-block")
	step("publish block", func() error { return publish("vol-block", st3, tg3, blockCap(), false) })
	var sb syscall.Stat_t
	if err := syscall.Stat(tg3, &sb); err != nil || sb.Mode&syscall.S_IFMT != syscall.S_IFBLK {
		t.Fatalf("%s is not a block device: mode %o %v", tg3, sb.Mode, err)
	}
	block := bytes.Repeat([]byte{0xa5}, 1<<20)
	step("write the block device", func() error { return writeSync(tg3, block) })
	if got, err := os.ReadFile(dev3); err != nil || !bytes.Equal(got[:len(block)], block) {
		t.Fatalf("read back from %s: %v", dev3, err)
	}
	// The bind of the device node is a mount of devtmpfs, not of the device: still found.
	if err := unstage("vol-block", st3); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tg3) {
		t.Fatalf("unstage of a published block volume: %v, want FailedPrecondition naming %s", err, tg3)
	}
	bstats, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-block", VolumePath: tg3})
	if err != nil || len(bstats.Usage) != 1 || bstats.Usage[0].Total != 64<<20 {
		t.Fatalf("block stats %v %v", bstats, err)
	}
	step("unpublish block", func() error { return unpublish("vol-block", tg3) })
	if _, err := os.Stat(tg3); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("block target left behind: %v", err)
	}
	step("unstage block", func() error { return unstage("vol-block", st3) })
	step("block device detached", func() error { return detached("vol-block", dev3) })
}

// TestNodeInGuestExpand grows volumes online the way Kubernetes does: the pool grows the
// array (the node agent's part after ControllerExpandVolume), then NodeExpandVolume makes
// /dev/nbdX learn the new size and grows the mounted ext4 and xfs. df must show the growth,
// the data written before must read back, and the new space must take data; a block volume
// reports its new device size.
func TestNodeInGuestExpand(t *testing.T) {
	vm.GuestHalf(t, "TestNodeVM")
	dir := t.TempDir()
	p, _ := openFilePool(t, 512<<20)
	// First-fit packs extents: spacers, deleted afterwards, leave room after each volume to
	// grow in place.
	for _, v := range []struct {
		name string
		size uint64
	}{{"vol-ext4", 64 << 20}, {"gap1", 128 << 20}, {"vol-xfs", 320 << 20}, {"gap2", 128 << 20}, {"vol-block", 64 << 20}} {
		if _, err := p.CreateVolume(v.name, v.size, pool.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", v.name, err)
		}
	}
	for _, g := range []string{"gap1", "gap2"} {
		if err := p.DeleteVolume(g); err != nil {
			t.Fatal(err)
		}
	}
	_, _, att := guestAttacher(t, p, dir, kernel.Options{Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	defer att.Close(context.Background())
	ns := guestNodeServer(t, att)
	ctx := context.Background()
	must := func(name string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}

	for _, tc := range []struct {
		id, fs       string
		from, to     int64
		fill         int64 // written after the growth (for ext4 more than the old filesystem had free)
		stage, mount string
	}{
		{"vol-ext4", "ext4", 64 << 20, 192 << 20, 64 << 20, "st-ext4", "pod-ext4"},
		{"vol-xfs", "xfs", 320 << 20, 448 << 20, 32 << 20, "st-xfs", "pod-xfs"},
	} {
		t.Run(tc.fs, func(t *testing.T) {
			staging, target := filepath.Join(dir, tc.stage), filepath.Join(dir, tc.mount)
			_, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: tc.id, StagingTargetPath: staging, VolumeCapability: mountCap(tc.fs)})
			must("stage", err)
			_, err = ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: tc.id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(tc.fs)})
			must("publish", err)
			dev := att.Device(tc.id)
			if dev == "" {
				t.Fatal("attacher reports no device for a staged volume")
			}
			old := make([]byte, 16<<20)
			_, _ = rand.Read(old)
			must("write before", writeSync(filepath.Join(target, "before"), old))
			df0 := dfSize(t, target)

			grown, err := p.ExpandVolume(tc.id, uint64(tc.to))
			must("pool expand", err)
			if int64(grown.Size) != tc.to {
				t.Fatalf("pool grew %s to %d, want %d", tc.id, grown.Size, tc.to)
			}
			if n := vm.BlockSize(t, dev); n != tc.from {
				t.Fatalf("%s has %d bytes before NodeExpandVolume, want still %d", dev, n, tc.from)
			}
			start := time.Now()
			r, err := ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: tc.id, VolumePath: target, StagingTargetPath: staging,
				VolumeCapability: mountCap(tc.fs), CapacityRange: &csi.CapacityRange{RequiredBytes: tc.to}})
			must("NodeExpandVolume", err)
			t.Logf("NodeExpandVolume %s %d -> %d bytes took %s", tc.fs, tc.from, tc.to, time.Since(start).Round(time.Millisecond))
			if r.GetCapacityBytes() != tc.to {
				t.Fatalf("NodeExpandVolume reports %d bytes, want %d", r.GetCapacityBytes(), tc.to)
			}
			if n := vm.BlockSize(t, dev); n != tc.to {
				t.Fatalf("%s has %d bytes after NodeExpandVolume, want %d", dev, n, tc.to)
			}
			df1 := dfSize(t, target)
			t.Logf("df %s: %d -> %d bytes", tc.fs, df0, df1)
			if df1-df0 < (tc.to-tc.from)*9/10 {
				t.Fatalf("df grew by %d bytes, the device by %d", df1-df0, tc.to-tc.from)
			}
			fill := make([]byte, tc.fill)
			_, _ = rand.Read(fill)
			must("fill the grown filesystem", writeSync(filepath.Join(target, "after"), fill))
			must("drop caches", os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200))
			for name, want := range map[string][]byte{"before": old, "after": fill} {
				if got, err := os.ReadFile(filepath.Join(staging, name)); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s reads back wrong after the growth (%v)", name, err)
				}
			}
			_, err = ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: tc.id, TargetPath: target})
			must("unpublish", err)
			_, err = ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: tc.id, StagingTargetPath: staging})
			must("unstage", err)
			if d := att.Device(tc.id); d != "" {
				t.Fatalf("attacher still reports %s after unstage", d)
			}
		})
	}

	t.Run("block", func(t *testing.T) {
		staging, target := filepath.Join(dir, "st-block"), filepath.Join(dir, "pod-block", "dev")
		_, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-block", StagingTargetPath: staging, VolumeCapability: blockCap()})
		must("stage", err)
		_, err = ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-block", StagingTargetPath: staging, TargetPath: target, VolumeCapability: blockCap()})
		must("publish", err)
		head := bytes.Repeat([]byte{0xc3}, 1<<20)
		must("write the head", writeSync(target, head))
		_, err = p.ExpandVolume("vol-block", 256<<20)
		must("pool expand", err)
		// kubelet passes the capability; without one the path's type decides.
		for _, vc := range []*csi.VolumeCapability{blockCap(), nil} {
			r, err := ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-block", VolumePath: target, VolumeCapability: vc})
			must("NodeExpandVolume", err)
			if r.GetCapacityBytes() != 256<<20 {
				t.Fatalf("NodeExpandVolume reports %d bytes, want %d", r.GetCapacityBytes(), 256<<20)
			}
		}
		if n := vm.BlockSize(t, target); n != 256<<20 {
			t.Fatalf("the published device has %d bytes, want %d", n, 256<<20)
		}
		tail := bytes.Repeat([]byte{0x3c}, 1<<20)
		f, err := os.OpenFile(target, os.O_RDWR, 0)
		must("open", err)
		defer f.Close()
		_, err = f.WriteAt(tail, 200<<20)
		must("write past the old end", err)
		must("fsync", f.Sync())
		got := make([]byte, 1<<20)
		for off, want := range map[int64][]byte{0: head, 200 << 20: tail} {
			if _, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read at %d: %v", off, err)
			}
		}
		_ = f.Close()
		_, err = ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-block", TargetPath: target})
		must("unpublish", err)
		_, err = ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-block", StagingTargetPath: staging})
		must("unstage", err)
	})
}

// dfSize is the size of the filesystem at path as df reports it, in bytes.
func dfSize(t *testing.T, path string) int64 {
	t.Helper()
	out, err := exec.Command("df", "-B1", "--output=size", path).Output()
	if err != nil {
		t.Fatalf("df %s: %v", path, err)
	}
	f := strings.Fields(string(out))
	n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
	if err != nil {
		t.Fatalf("df %s: %q", path, out)
	}
	return n
}

// blkid returns the filesystem type on dev ("" when blank).
func blkid(t *testing.T, dev string) string {
	t.Helper()
	out, _ := exec.Command("blkid", "-p", "-s", "TYPE", "-o", "value", dev).Output()
	return strings.TrimSpace(string(out))
}

func writeSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// TestNodeInGuestRestart restarts the node plugin's data path while a mounted filesystem
// is being written: the old attacher stops serving (devices stay attached and recorded), a
// new one over the same pool and state file reattaches with NBD_CMD_RECONFIGURE, and no
// write or fsync fails; the data reads back.
func TestNodeInGuestRestart(t *testing.T) {
	vm.GuestHalf(t, "TestNodeVM")
	dir := t.TempDir()
	p, _ := openFilePool(t, 256<<20)
	if _, err := p.CreateVolume("vol-restart", 128<<20, pool.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A request the kernel had written into a socket that the stopped server never read is
	// requeued only when its timeout expires: the writer may stall up to Timeout.
	kopts := kernel.Options{Timeout: 10 * time.Second, DeadConnTimeout: 60 * time.Second}
	_, _, att := guestAttacher(t, p, dir, kopts)
	statePath := filepath.Join(dir, nbdStateFile)
	ns := guestNodeServer(t, att)
	ctx := context.Background()
	staging := filepath.Join(dir, "staging")
	if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-restart", StagingTargetPath: staging, VolumeCapability: mountCap("ext4")}); err != nil {
		t.Fatal(err)
	}
	dev, err := att.Attach(ctx, "vol-restart")
	if err != nil {
		t.Fatal(err)
	}

	// A writer appends and fsyncs 4 KiB records until told to stop.
	w := startRecordWriter(filepath.Join(staging, "log"))
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	att.Close(ctx) // the "old process" stops serving; the device stays attached
	time.Sleep(500 * time.Millisecond)
	att2, err := attach.OpenPoolAttacher(ctx, p, statePath, kopts) // the "new process" starts
	if err != nil {
		t.Fatalf("reattach: %v", err)
	}
	defer att2.Close(context.Background())
	dev2, err := att2.Attach(ctx, "vol-restart")
	if err != nil || dev2 != dev {
		t.Fatalf("reattached on %s (%v), was %s", dev2, err, dev)
	}
	if !att2.Reattached("vol-restart") {
		t.Fatal("the new attacher connected a new device instead of reconfiguring the old one")
	}
	t.Logf("restart took %s", time.Since(start).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	w.stopAndVerify(t)
	ns2 := guestNodeServer(t, att2)
	if _, err := ns2.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-restart", StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if st, err := kernel.OpenState(statePath); err != nil {
		t.Fatal(err)
	} else if _, ok := st.Get("vol-restart"); ok {
		t.Fatal("still recorded after unstage")
	}
}

// recordWriter appends 4 KiB records (record(i)) to a file and fsyncs each, until stopped:
// the I/O that a restart of the plugin must not fail.
type recordWriter struct {
	path    string
	stop    chan struct{}
	done    chan error
	written int
	slowest time.Duration
}

func startRecordWriter(path string) *recordWriter {
	w := &recordWriter{path: path, stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			w.done <- err
			return
		}
		defer f.Close()
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				w.written = i
				w.done <- nil
				return
			default:
			}
			if _, err := f.Write(record(i)); err != nil {
				w.done <- err
				return
			}
			t0 := time.Now()
			if err := f.Sync(); err != nil {
				w.done <- err
				return
			}
			w.slowest = max(w.slowest, time.Since(t0))
		}
	}()
	return w
}

// stopAndVerify stops the writer and fails t if any write or fsync failed or the file does not
// hold exactly the records written, in order.
func (w *recordWriter) stopAndVerify(t *testing.T) {
	t.Helper()
	close(w.stop)
	if err := <-w.done; err != nil {
		t.Fatalf("writer saw an error across the restart: %v", err)
	}
	got, err := os.ReadFile(w.path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != w.written*4096 {
		t.Fatalf("log has %d bytes, want %d records", len(got), w.written)
	}
	for i := 0; i < w.written; i++ {
		if !bytes.Equal(got[i*4096:(i+1)*4096], record(i)) {
			t.Fatalf("record %d differs", i)
		}
	}
	t.Logf("%d records written and read back across the restart; slowest fsync %s", w.written, w.slowest.Round(time.Millisecond))
}

func record(i int) []byte {
	b := bytes.Repeat([]byte{byte(i)}, 4096)
	copy(b, strconv.Itoa(i))
	return b
}

// openFilePool opens a pool on four sparse files of diskSize bytes in a temporary
// directory and returns it with its configuration; it is closed when the test ends.
func openFilePool(t *testing.T, diskSize int64) (*pool.Pool, pool.Config) {
	t.Helper()
	return openPoolOn(t, vm.SparseFiles(t, t.TempDir(), "disk", 4, diskSize))
}

// openPoolOn opens a pool on the disks at paths (files or block devices) with the member
// deadline off, as openFilePool; the pool is closed when t ends.
func openPoolOn(t *testing.T, paths []string) (*pool.Pool, pool.Config) {
	t.Helper()
	var cfg pool.Config
	for _, path := range paths {
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: path})
	}
	// These tests drive the node service, not the member deadline (the engine's tests and
	// test/diskfault do): on the emulated disks of a loaded 2-core host a member write took
	// over the default 5 s, failing a member and the expansion after it. Negative: off.
	cfg.MemberTimeout = -1
	p, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p, cfg
}

// nbdStateFile is the NBD state file's name in the guest tests' directory.
const nbdStateFile = "nbd-state.json"

// guestAttacher opens the node's data path in the guest as the node plugin does: the
// kernel's nbd netlink family, the NBD state file dir/nbd-state.json and a PoolAttacher
// over p with kopts, the process marked as an I/O flusher. The netlink socket is closed
// when the test ends.
func guestAttacher(t *testing.T, p *pool.Pool, dir string, kopts kernel.Options) (*kernel.Netlink, *kernel.State, *attach.PoolAttacher) {
	t.Helper()
	nl, err := kernel.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	state, err := kernel.OpenState(filepath.Join(dir, nbdStateFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := kernel.SetIOFlusher(); err != nil {
		t.Fatal(err)
	}
	return nl, state, attach.NewPoolAttacher(p, nl, state, kopts)
}

// guestNodeServer is the CSI node service over att with the host's mounter and exec.
func guestNodeServer(t *testing.T, att VolumeAttacher) *NodeServer {
	t.Helper()
	return guestNodeServerCrypt(t, att, crypt.Options{})
}

// guestCryptNodeServer is guestNodeServer with the encryption tests' cheap key derivation
// (pbkdf2 at its fewest iterations, no benchmark): argon2id at cryptsetup's defaults costs
// seconds of emulated CPU per format and per open.
func guestCryptNodeServer(t *testing.T, att VolumeAttacher) *NodeServer {
	t.Helper()
	return guestNodeServerCrypt(t, att, crypt.Options{PBKDF: crypt.PBKDFPBKDF2, ForceIterations: 1000})
}

// guestNodeServerCrypt is the CSI node service over att with the host's mounter and exec,
// and copts for the LUKS2 keyslots it writes.
func guestNodeServerCrypt(t *testing.T, att VolumeAttacher, copts crypt.Options) *NodeServer {
	t.Helper()
	ns, err := NewNodeServer(NodeConfig{NodeID: "vm-node", Attacher: att, Mounter: mount.New(""), Exec: utilexec.New(), Crypt: copts})
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
