package pool

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/test/vm"
)

// vmDiskSize is the size of each emulated disk of TestBlockDevicesReadZeroesVM.
const vmDiskSize = 128 << 20

// TestBlockDevicesReadZeroesVM runs TestBlockDevicesReadZeroesInGuest in the VM on three
// emulated disks of a real kernel, two NVMe and one virtio-blk, so that the zeroing of new
// extents (BLKZEROOUT) goes through the kernel's nvme and virtio_blk drivers to QEMU's
// devices rather than through the loop driver (issue 23 section 3). The same boot runs
// TestHungPredecessorInGuest on device-mapper devices over four brd ramdisks.
func TestBlockDevicesReadZeroesVM(t *testing.T) {
	vm.HostHalf(t)
	files := vm.SparseFiles(t, t.TempDir(), "disk", 3, vmDiskSize)
	var disks []vm.Disk
	for i, f := range files {
		disks = append(disks, vm.Disk{File: f, NVMe: i < 2, Serial: fmt.Sprintf("zero%d", i)})
	}
	res := vm.RunGoTestOpts(t, vm.Options{Timeout: 6 * time.Minute, Memory: 1024, CPUs: 1, Disks: disks,
		Modules:      append(append([]string{}, vm.DefaultModules...), "nvme", "virtio_blk", "dm_mod", "dm_delay"),
		ModuleParams: map[string]string{"brd": fmt.Sprintf("rd_nr=4 rd_size=%d", hungRAM>>10)}},
		".", "-test.run=^(TestBlockDevicesReadZeroesInGuest|TestHungPredecessorInGuest)$", "-test.v", "-test.timeout=5m")
	t.Logf("VM run: boot %s, total %s", res.Boot.Round(time.Second), res.Duration.Round(time.Second))
}

// TestBlockDevicesReadZeroesInGuest: TestBlockDevicesReadZeroes's body on the guest's
// emulated NVMe and virtio-blk disks, filled with a non-zero pattern first: a new volume,
// one created again after a delete over the pattern, the range an expansion adds and a
// larger restore's tail all read zeroes, end to end through the engine.
func TestBlockDevicesReadZeroesInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestBlockDevicesReadZeroesVM")
	nvme, _ := filepath.Glob("/dev/nvme[0-9]n1")
	virtio, _ := filepath.Glob("/dev/vd[a-z]")
	devs := append(append([]string{}, nvme...), virtio...)
	if len(nvme) != 2 || len(virtio) != 1 {
		t.Fatalf("want 2 NVMe and 1 virtio-blk disk in the guest, found %q", devs)
	}
	for _, d := range devs {
		name := filepath.Base(d)
		wz, err := os.ReadFile(filepath.Join("/sys/block", name, "queue/write_zeroes_max_bytes"))
		if err != nil {
			t.Fatal(err)
		}
		// 0: the kernel zeroes by writing zero pages itself; BLKZEROOUT is correct either way.
		t.Logf("%s: write_zeroes_max_bytes %s", d, strings.TrimSpace(string(wz)))
	}
	start := time.Now()
	readZeroesOn(t, devs, vmDiskSize)
	t.Logf("pattern, create, delete and create, expand, snapshot and restore: %v in the guest", time.Since(start))
}
