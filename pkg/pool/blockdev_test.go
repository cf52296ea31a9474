package pool

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// TestDiskInUse: a second pool on the same disks (another agent, or the CLI while an agent
// runs) gets none of them.
func TestDiskInUse(t *testing.T) {
	paths := makeDisks(t, t.TempDir(), 2, 64<<20)
	cfg := configFor(paths...)
	p := openPool(t, cfg)
	defer p.Close()
	q := openPool(t, cfg)
	defer q.Close()
	for _, d := range q.Disks() {
		if d.Status != StatusRefused || !strings.Contains(d.Reason, "in use") {
			t.Fatalf("second pool got %+v", d)
		}
	}
	if _, err := q.AddDisk(DiskConfig{Path: paths[0]}); !errors.Is(err, ErrDiskInUse) {
		t.Fatalf("AddDisk of a locked disk: %v", err)
	}
}

// losetup attaches a file to a free loop device, detached at the end of the test.
func losetup(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", file).Output()
	if err != nil {
		testenv.Missing(t, "no loop device (needs root and losetup): %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// TestBlockDevices runs the pool on real block devices (loop devices): exclusive open,
// size from the device, a volume created (its extents zeroed with BLKZEROOUT), data through
// it, and delete with BLKDISCARD.
func TestBlockDevices(t *testing.T) {
	testenv.RequireRoot(t, "loop devices")
	dir := t.TempDir()
	files := makeDisks(t, dir, 3, 96<<20)
	var devs []string
	for _, f := range files {
		devs = append(devs, losetup(t, f))
	}
	cfg := configFor(devs...)
	p := openPool(t, cfg)
	for _, d := range p.Disks() {
		if d.Status != StatusActive || d.Size != 96<<20 {
			t.Fatalf("loop disk: %+v", d)
		}
	}
	if _, err := p.CreateVolume("blk", 32<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(2 << 20)
	writeVolume(t, p, "blk", data, 4<<20)
	p.Close()
	p = openPool(t, cfg)
	defer p.Close()
	checkVolume(t, p, "blk", data, 4<<20)
	if err := p.DeleteVolume("blk"); err != nil {
		t.Fatal(err)
	}
	if c := p.Capacity(); c.FreeRaw != c.Raw {
		t.Fatalf("after delete: %+v", c)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestBlockIdentity(t *testing.T) {
	root := t.TempDir()
	oldSys, oldByID := sysClassBlock, devDiskByID
	sysClassBlock, devDiskByID = root+"/sys", root+"/by-id"
	defer func() { sysClassBlock, devDiskByID = oldSys, oldByID }()
	write := func(p, v string) {
		if err := os.MkdirAll(p[:strings.LastIndex(p, "/")], 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dev := root + "/dev/nvme0n1"
	write(dev, "")
	write(sysClassBlock+"/nvme0n1/wwid", "eui.0025385b71b0a1c2")
	write(sysClassBlock+"/nvme0n1/device/serial", "S4EWNX0R123456")
	write(sysClassBlock+"/sdb/device/wwid", "naa.5000c500a1b2c3d4")
	_ = os.MkdirAll(devDiskByID, 0o755)
	_ = os.Symlink(dev, devDiskByID+"/nvme-Samsung_SSD_970_S4EWNX0R123456")
	_ = os.Symlink(dev, devDiskByID+"/wwn-eui.0025385b71b0a1c2")
	_ = os.Symlink(root+"/dev/other", devDiskByID+"/nvme-other")

	id := blockIdentity(dev)
	want := Identity{WWN: "eui.0025385b71b0a1c2", Serial: "S4EWNX0R123456", ByID: devDiskByID + "/wwn-eui.0025385b71b0a1c2"}
	if id != want || id.String() != want.WWN {
		t.Fatalf("nvme: %+v", id)
	}
	if id := blockIdentity(root + "/dev/sdb"); id.WWN != "naa.5000c500a1b2c3d4" || id.Serial != "" {
		t.Fatalf("sdb: %+v", id)
	}
	if id := blockIdentity(root + "/dev/loop9"); id != (Identity{}) || id.String() != "" {
		t.Fatalf("loop: %+v", id)
	}
}

// TestBlockDevicesReadZeroes: on block devices that hold another tenant's bytes, nothing
// new reads them. The loop devices are filled with a non-zero pattern; a new volume reads
// zeroes end to end, with no initial resync; deleted (its bytes overwritten by the pattern
// again, as a device whose discard keeps data would leave them) and created again it reads
// zeroes; the range an expansion adds reads zeroes; a snapshot reads the volume as of the
// cut, and a larger restore from it reads the snapshot followed by zeroes. Every copy
// agrees at the end (Check scrubs).
func TestBlockDevicesReadZeroes(t *testing.T) {
	testenv.RequireRoot(t, "loop devices")
	const diskSize = 128 << 20
	var devs []string
	for _, f := range makeDisks(t, t.TempDir(), 3, diskSize) {
		devs = append(devs, losetup(t, f))
	}
	readZeroesOn(t, devs, diskSize)
}

// readZeroesOn is TestBlockDevicesReadZeroes's body on the block devices devs, each
// diskSize bytes: loop devices on the host, the guest's emulated NVMe and virtio disks in
// TestBlockDevicesReadZeroesInGuest. The devices are filled with the pattern first (and one
// MiB of each read back, so a device that drops writes cannot pass for one that zeroes).
func readZeroesOn(t *testing.T, devs []string, diskSize int64) {
	t.Helper()
	for _, d := range devs {
		fillPattern(t, d, 0, diskSize)
		requirePattern(t, d, diskSize-1<<20, 1<<20)
	}
	p := openPool(t, configFor(devs...))
	defer p.Close()
	createZeroed := func() {
		t.Helper()
		start := time.Now()
		vi, err := p.CreateVolume("z", 16<<20, CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("created a 16 MiB volume over %d block devices (zeroing included) in %v", len(devs), time.Since(start))
		requireZeroes(t, p, "z", 0, 16<<20)
		if vi.Sync != nil {
			t.Fatalf("new volume on zeroed block extents resyncs: %+v", vi.Sync)
		}
	}
	createZeroed()
	writeVolume(t, p, "z", randBytes(16<<20), 0)
	p.mu.Lock()
	var old []ExtentEntry
	var oldDevs []string
	for _, r := range p.byName["z"].roles {
		old, oldDevs = append(old, r.ext), append(oldDevs, r.disk.path)
	}
	p.mu.Unlock()
	if err := p.DeleteVolume("z"); err != nil {
		t.Fatal(err)
	}
	for i, x := range old {
		fillPattern(t, oldDevs[i], int64(x.Offset), int64(x.Length))
	}
	createZeroed()
	if _, err := p.ExpandVolume("z", 32<<20); err != nil {
		t.Fatal(err)
	}
	requireZeroes(t, p, "z", 16<<20, 16<<20)
	head := randBytes(1 << 20)
	writeVolume(t, p, "z", head, 0)
	if _, err := p.CreateSnapshot("s", "z"); err != nil {
		t.Fatal(err)
	}
	waitSnapshotReady(t, p, "s")
	if got := readArray(t, snapArray(t, p, "s"), 1<<20); !bytes.Equal(got, head) {
		t.Fatal("snapshot: the volume's first MiB differs")
	}
	if _, err := p.CreateVolume("r", 48<<20, CreateOptions{Source: &Source{Snapshot: "s"}}); err != nil {
		t.Fatal(err)
	}
	waitHydrated(t, p, "r")
	checkVolume(t, p, "r", head, 0)
	requireZeroes(t, p, "r", 1<<20, 47<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// fillPattern writes a pattern without zero bytes over [off, off+n) of a file or device.
func fillPattern(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := pattern()
	for done := int64(0); done < n; done += int64(len(b)) {
		if _, err := f.WriteAt(b[:min(int64(len(b)), n-done)], off+done); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// pattern is what fillPattern writes: a MiB whose bytes are never zero, repeated.
func pattern() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i%251) + 1
	}
	return b
}

// requirePattern fails the test unless [off, off+n) of path (n at most a MiB, off a
// multiple of one) reads fillPattern's bytes.
func requirePattern(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, n)
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatalf("%s: read at %d: %v", path, off, err)
	}
	if !bytes.Equal(got, pattern()[:n]) {
		t.Fatalf("%s: the pattern written at %d does not read back", path, off)
	}
}

// requireZeroes fails the test unless [off, off+n) of the volume reads zeroes only.
func requireZeroes(t *testing.T, p *Pool, name string, off, n int64) {
	t.Helper()
	a, err := p.Array(name)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1<<20)
	for pos := off; pos < off+n; pos += int64(len(b)) {
		chunk := b[:min(int64(len(b)), off+n-pos)]
		if _, err := a.ReadAt(chunk, pos); err != nil {
			t.Fatalf("volume %s: read at %d: %v", name, pos, err)
		}
		if i := slices.IndexFunc(chunk, func(c byte) bool { return c != 0 }); i >= 0 {
			t.Fatalf("volume %s: byte %d reads %#x, not zero (stale contents of its extents)", name, pos+int64(i), chunk[i])
		}
	}
}
