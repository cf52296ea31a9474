package pool

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

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
// size from the device, a volume created (with a background resync, since a device is not
// known to read back zeroes), data through it, and delete with BLKDISCARD.
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
