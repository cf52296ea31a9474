package vm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SparseFile creates (or empties) a sparse file of size bytes at path, its directory
// too, and returns path: a disk image that costs no space until written.
func SparseFile(t testing.TB, path string, size int64) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

// SparseFiles makes n sparse files of size bytes, <prefix>0.img and on, in dir.
func SparseFiles(t testing.TB, dir, prefix string, n int, size int64) []string {
	t.Helper()
	var paths []string
	for i := range n {
		paths = append(paths, SparseFile(t, filepath.Join(dir, fmt.Sprintf("%s%d.img", prefix, i)), size))
	}
	return paths
}

// LoopDevices attaches each file to a free loop device (losetup --find) and returns the
// devices in the files' order; they are detached when the test ends.
func LoopDevices(t testing.TB, files []string) []string {
	t.Helper()
	var loops []string
	for _, file := range files {
		out, err := exec.Command("losetup", "--find", "--show", file).Output()
		if err != nil {
			var stderr []byte
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				stderr = ee.Stderr
			}
			t.Fatalf("losetup %s: %v: %s", file, err, stderr)
		}
		loop := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
		loops = append(loops, loop)
	}
	return loops
}

// DMDisk is a device-mapper device over another block device, the member of an array
// whose behaviour a test changes under the running array by swapping its table: slow
// (Delayed), partly unreadable (WithErrors) or gone (Dead), and back (Linear).
type DMDisk struct {
	Name    string // the device is /dev/mapper/<Name>
	Under   string // the block device it maps
	Sectors int64  // its size in 512-byte sectors
}

// Path is the device's node.
func (d DMDisk) Path() string { return "/dev/mapper/" + d.Name }

// Linear is the table that maps the whole device under it.
func (d DMDisk) Linear() string { return fmt.Sprintf("0 %d linear %s 0", d.Sectors, d.Under) }

// Delayed is the table of the whole device with every request held for ms milliseconds.
func (d DMDisk) Delayed(ms int) string {
	return fmt.Sprintf("0 %d delay %s 0 %d", d.Sectors, d.Under, ms)
}

// WithErrors is the table with [from, from+n) bytes answering every request with an
// error (the `error` target) and the rest linear.
func (d DMDisk) WithErrors(from, n int64) string {
	s, c := from/512, n/512
	return fmt.Sprintf("0 %d linear %s 0\n%d %d error\n%d %d linear %s %d",
		s, d.Under, s, c, s+c, d.Sectors-s-c, d.Under, s+c)
}

// Dead is the table of a disk that answers every request with an error.
func (d DMDisk) Dead() string { return fmt.Sprintf("0 %d error", d.Sectors) }

// Swap replaces d's table under the running array, as a disk that changes its behaviour
// would: the table is loaded into the inactive slot, then resume suspends the device,
// swaps the tables and resumes it in one ioctl (suspending a delay target releases the
// requests it holds). It returns when the resume began and ended: the new table took
// over in between.
func (d DMDisk) Swap(t testing.TB, table string) (from, to time.Time) {
	t.Helper()
	Sh(t, "dmsetup", "load", d.Name, "--table", table)
	from = time.Now()
	Sh(t, "dmsetup", "resume", "--noudevsync", d.Name)
	return from, time.Now()
}

// NewDMDisks creates the dm devices <name>0.. as linear maps of size bytes over the
// devices under, in order; they are removed when the test ends (a removal that fails,
// because something still holds the device, fails the test).
func NewDMDisks(t testing.TB, name string, under []string, size int64) []DMDisk {
	t.Helper()
	var disks []DMDisk
	for i, u := range under {
		d := DMDisk{Name: fmt.Sprintf("%s%d", name, i), Under: u, Sectors: size / 512}
		Sh(t, "dmsetup", "create", d.Name, "--noudevsync", "--table", d.Linear())
		disks = append(disks, d)
		t.Cleanup(func() {
			if out, err := exec.Command("dmsetup", "remove", "--noudevsync", d.Name).CombinedOutput(); err != nil {
				t.Errorf("dmsetup remove %s: %v\n%s", d.Name, err, out)
			}
		})
	}
	Sh(t, "dmsetup", "mknodes")
	return disks
}

// BlockSize is a block device's size as the kernel reports it to user space
// (BLKGETSIZE64).
func BlockSize(t testing.TB, dev string) int64 {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // opened read-only: nothing to flush
	var n uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatalf("BLKGETSIZE64 %s: %v", dev, e)
	}
	return int64(n)
}

// QueueAttr is the block device's queue attribute attr
// (/sys/block/<dev>/queue/<attr>), trimmed.
func QueueAttr(t testing.TB, dev, attr string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// MkfsExt4 makes ext4 on dev with its inode tables and journal written at once, so that
// no lazy initialisation writes in the background of what the test measures.
func MkfsExt4(t testing.TB, dev string) {
	t.Helper()
	Sh(t, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev)
}

// Mount mounts dev on mnt (made if missing) and returns the function that unmounts it;
// a mount still there when the test ends is detached lazily (umount -l).
func Mount(t testing.TB, dev, mnt string) (umount func()) {
	t.Helper()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	Sh(t, "mount", dev, mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = exec.Command("umount", "-l", mnt).Run()
		}
	})
	return func() {
		t.Helper()
		Sh(t, "umount", mnt)
		mounted = false
	}
}
