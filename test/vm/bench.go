package vm

import (
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// The benchmarks compare the engine with md raid10 over the same kind of disks in one
// boot (the guest's speed follows the host's load, so only ratios within a run mean
// anything): CreateMD sets up the reference, CreateArray the engine's array,
// CPUProfile profiles the serving process in the guest, and PprofTop shows that profile
// on the host.

// CreateMD creates the md raid10 array dev (e.g. /dev/md0) over members, clean and
// running at once (mdadm --create --level=10 --assume-clean --run, then extra, e.g.
// --bitmap=none), and returns the function that stops it and zeroes the members'
// superblocks, so that the same disks can carry the engine's array next. The array is
// stopped when the test ends if it still runs.
func CreateMD(t testing.TB, dev string, members []string, extra ...string) (stop func()) {
	t.Helper()
	args := append([]string{"--create", dev, "--level=10", "--raid-devices=" + strconv.Itoa(len(members)),
		"--assume-clean", "--run", "--quiet"}, extra...)
	Sh(t, "mdadm", append(args, members...)...)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { _ = exec.Command("mdadm", "--stop", dev).Run() }) })
	return func() {
		t.Helper()
		once.Do(func() {
			Sh(t, "mdadm", "--stop", dev)
			Sh(t, "mdadm", append([]string{"--zero-superblock"}, members...)...)
		})
	}
}

// OpenFileMembers opens each path (a disk, a ramdisk, a file) as an engine member.
func OpenFileMembers(paths []string) ([]raid10.Member, error) {
	var ms []raid10.Member
	for _, p := range paths {
		m, err := raid10.OpenFileMember(p)
		if err != nil {
			for _, o := range ms {
				_ = o.Close()
			}
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// CreateArray creates the engine's array over paths with opts; the caller closes it.
func CreateArray(t testing.TB, paths []string, opts raid10.CreateOptions) *raid10.Array {
	t.Helper()
	ms, err := OpenFileMembers(paths)
	if err != nil {
		t.Fatal(err)
	}
	arr, err := raid10.Create(ms, opts)
	if err != nil {
		t.Fatal(err)
	}
	return arr
}

// CPUProfile profiles this process into path until the returned function is called.
// The profile carries its symbols, so the host can read it after the guest's test
// binary is gone.
func CPUProfile(t testing.TB, path string) (stop func()) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

// PprofTop is the top 25 functions of the CPU profile at path (go tool pprof -top).
func PprofTop(path string) (string, error) {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", path).CombinedOutput()
	return string(out), err
}
