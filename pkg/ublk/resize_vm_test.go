package ublk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestUblkNewestVM boots the newest kernel of the harness (vm.NewestKernelSeries, 7.3) and
// runs the ublk tests there, with the online resize and the zero copy that kernel has: one
// boot for the attach, restart, resize and zero-copy checks (the attach and restart tests
// run zero-copy there too: Create takes it where the kernel has it).
func TestUblkNewestVM(t *testing.T) {
	vm.HostHalf(t)
	vm.RunGoTestOpts(t, vm.Options{Timeout: 9 * time.Minute, Memory: 2048,
		KernelSeries: vm.NewestKernelSeries, Modules: append(slices.Clone(vm.DefaultModules), "ublk_drv"),
		Tests: []string{"TestInGuestAttach", "TestInGuestKill9", "TestInGuestResize", "TestInGuestZeroCopy"}},
		".", "-test.run=^TestInGuest(Attach|Kill9|Resize|ZeroCopy)$", "-test.v", "-test.timeout=8m")
}

// kernelRelease is the running kernel's release and its major.minor as one number
// (major*1000+minor: 6.12 is 6012, 7.3 is 7003).
func kernelRelease(t *testing.T) (string, int) {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", rel, err)
	}
	return rel, major*1000 + minor
}

// checkKernelFeatures asserts what GET_FEATURES reports against the running kernel's
// release: user recovery with reissue everywhere, UPDATE_SIZE from 6.16 on (so Required,
// which frontend auto asks for, is complete exactly there), and on the newest kernel of the
// harness every Reported feature (zero copy with automatic buffer registration, per-I/O
// daemons, batched commands).
func checkKernelFeatures(t *testing.T, ctx context.Context) Flags {
	t.Helper()
	rel, ver := kernelRelease(t)
	f, err := Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s: ublk features %#x %s; reported: %q; missing of Required: %s", rel, uint64(f), f, f.Report(), f.Missing(Required))
	if !f.Has(FlagUserRecovery | FlagUserRecoveryReissue | FlagCmdIoctlEncode) {
		t.Fatalf("kernel %s lacks user recovery with reissue or ioctl encoding: %s", rel, f)
	}
	if want := ver >= 6016; f.Has(FlagUpdateSize) != want || f.Has(Required) != want {
		t.Errorf("kernel %s: UPDATE_SIZE %v, all of Required %v; want both %v (6.16+)", rel, f.Has(FlagUpdateSize), f.Has(Required), want)
	}
	if strings.HasPrefix(rel, vm.NewestKernelSeries+".") && !f.Has(Reported) {
		t.Errorf("kernel %s lacks %s of the features reported", rel, f.Missing(Reported))
	}
	return f
}

// TestInGuestResize grows a served device online: a 64 MiB raid10 array over ublk with ext4
// and a file of known content; the array grows to 256 MiB and Resize (UPDATE_SIZE) tells
// the kernel while the filesystem is mounted; the block device has the new size at once,
// resize2fs grows ext4 online, a file larger than the old filesystem fits, and after a
// remount both files read back as written and e2fsck finds the filesystem clean. A size
// past the backend is refused without reaching the kernel.
func TestInGuestResize(t *testing.T) {
	inGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if f := checkKernelFeatures(t, ctx); !f.Has(FlagUpdateSize) {
		t.Fatalf("kernel without UPDATE_SIZE: %s", f)
	}
	dir := t.TempDir()
	ms, err := vm.OpenFileMembers(vm.SparseFiles(t, dir, "m", 4, 160<<20))
	if err != nil {
		t.Fatal(err)
	}
	arr, err := raid10.Create(ms, raid10.CreateOptions{AssumeClean: true, Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = arr.Close() }()
	d, err := Create(ctx, arr, Options{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Delete(context.Background()) }()
	dev, mnt := d.Path(), filepath.Join(dir, "mnt")
	vm.MkfsExt4(t, dev)
	umount := vm.Mount(t, dev, mnt)
	small := writePattern(t, filepath.Join(mnt, "small"), 8<<20, 1)

	const grown = 256 << 20
	if err := arr.Grow(grown); err != nil {
		t.Fatal(err)
	}
	if err := d.Resize(ctx, grown+pageSize); err == nil {
		t.Error("Resize past the backend's size accepted")
	}
	start := time.Now()
	if err := d.Resize(ctx, grown); err != nil {
		t.Fatal(err)
	}
	t.Logf("resized %s to %d bytes in %s", dev, int64(grown), time.Since(start).Round(time.Microsecond))
	if got, err := d.Size(); err != nil || got != grown {
		t.Fatalf("after Resize the kernel has %d bytes (%v), want %d", got, err, grown)
	}
	if got := strings.TrimSpace(vm.Sh(t, "blockdev", "--getsize64", dev)); got != fmt.Sprint(grown) {
		t.Fatalf("blockdev --getsize64 %s = %s, want %d", dev, got, grown)
	}
	vm.Sh(t, "resize2fs", dev)
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if total := int64(st.Blocks) * st.Bsize; total < 200<<20 {
		t.Fatalf("ext4 on %s has %d bytes after resize2fs, want about %d", dev, total, int64(grown))
	}
	big := writePattern(t, filepath.Join(mnt, "big"), 96<<20, 2) // more than the old filesystem held
	umount()
	vm.Sh(t, "e2fsck", "-fn", dev)
	umount = vm.Mount(t, dev, mnt)
	defer umount()
	for name, want := range map[string][32]byte{"small": small, "big": big} {
		b, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || sha256.Sum256(b) != want {
			t.Errorf("%s after the remount: %d bytes, %v; content differs from what was written", name, len(b), err)
		}
	}
	vm.NoKernelWarning(t)
}

// writePattern writes size bytes of a pattern seeded by seed to p, fsynced, and returns
// their hash.
func writePattern(t *testing.T, p string, size int, seed byte) [32]byte {
	t.Helper()
	b := bytes.Repeat([]byte{seed}, size)
	for i := range b {
		b[i] += byte(i*31 + i>>12)
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}
