package diskfault

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestDiskFaultVM boots the VM and runs the in-guest fault tests of this package there;
// each must pass there. brd gives 13 ramdisks of 192 MiB (pages are allocated only when
// written): ram0-3 for the slow-disk test, ram4-7 for the bad-block test, ram8-12 for the
// comeback test (4 members and a spare).
func TestDiskFaultVM(t *testing.T) {
	vm.HostHalf(t)
	vm.RunGoTestOpts(t, vm.Options{Timeout: 9 * time.Minute, Memory: 2048,
		Modules:      []string{"nbd", "brd", "ext4", "dm_mod", "dm_delay"},
		ModuleParams: map[string]string{"brd": fmt.Sprintf("rd_nr=13 rd_size=%d", ramSize>>10)}},
		".", "-test.run=^(TestSlowDiskInGuest|TestBadBlocksInGuest|TestComebackInGuest)$", "-test.v", "-test.timeout=8m")
}

// ramSize is the size of each brd ramdisk (TestDiskFaultVM's rd_size).
const ramSize = 192 << 20

// newDM creates the dm devices name0.. over /dev/ram<first>.. as linear maps; they are
// removed at the end of the test.
func newDM(t *testing.T, name string, first, n int) []vm.DMDisk {
	t.Helper()
	var rams []string
	for i := range n {
		rams = append(rams, fmt.Sprintf("/dev/ram%d", first+i))
	}
	return vm.NewDMDisks(t, name, rams, ramSize)
}

// openMembers opens the dm devices as raid10 members (O_DIRECT).
func openMembers(t *testing.T, devs []vm.DMDisk) ([]raid10.Member, []*raid10.FileMember) {
	t.Helper()
	var ms []raid10.Member
	var fms []*raid10.FileMember
	for _, d := range devs {
		m, err := raid10.OpenFileMember(d.Path())
		if err != nil {
			t.Fatal(err)
		}
		if !m.Direct() {
			t.Fatalf("%s: no O_DIRECT", d.Path())
		}
		ms = append(ms, m)
		fms = append(fms, m)
		t.Cleanup(func() { m.Close() })
	}
	return ms, fms
}

// dataOffset reads the data offset from the superblock (copy A, byte 64) of a member.
func dataOffset(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], 64); err != nil {
		t.Fatal(err)
	}
	return int64(binary.LittleEndian.Uint64(b[:]))
}

// serve serves arr over NBD to the guest's kernel and returns /dev/nbdX. The kernel's
// request timeout (30 s) is far above the member deadline, so a stalled member is the
// engine's to handle, not a kernel re-send. Detached at the end of the test.
func serve(t *testing.T, arr *raid10.Array, volumeID string) string {
	t.Helper()
	srv, err := nbd.NewServer(nbd.Options{MinBlockSize: raid10.BlockSize}, nbd.Export{Name: "vol", Backend: arr})
	if err != nil {
		t.Fatal(err)
	}
	nl, err := kernel.Dial()
	if err != nil {
		t.Fatal(err)
	}
	st, err := kernel.OpenState(filepath.Join(t.TempDir(), "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kernel.SetIOFlusher(); err != nil {
		t.Fatal(err)
	}
	a := kernel.NewAttacher(srv, nl, st, kernel.Options{Connections: 2, Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	d, err := a.Attach(volumeID, "vol")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Detach(volumeID); err != nil {
			t.Error(err)
		}
		a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		nl.Close()
	})
	return d.Path()
}

// figure logs one measured figure in a form that is easy to collect from the output.
func figure(t *testing.T, name string, format string, args ...any) {
	t.Helper()
	t.Logf("figure: %s: %s", name, fmt.Sprintf(format, args...))
}
