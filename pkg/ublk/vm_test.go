package ublk

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// The in-guest tests run as root in a QEMU guest booted with the 6.12 kernel (ublk_drv); on
// the host they skip, and TestUblkVM runs them there.

const helperEnv = "UBLK_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "serve" {
		os.Exit(serveHelper())
	}
	os.Exit(m.Run())
}

// TestUblkVM boots the 6.12 kernel and runs the TestInGuest* tests there; each must pass.
func TestUblkVM(t *testing.T) {
	vm.HostHalf(t)
	vm.RunGoTestOpts(t, vm.Options{Timeout: 8 * time.Minute, Memory: 2048,
		KernelSeries: vm.UblkKernelSeries, Modules: append(slices.Clone(vm.DefaultModules), "ublk_drv"),
		Tests: []string{"TestInGuestAttach", "TestInGuestKill9"}},
		".", "-test.run=^TestInGuest(Attach|Kill9)$", "-test.v", "-test.timeout=7m")
}

func inGuest(t *testing.T) {
	t.Helper()
	vm.GuestHalf(t, "TestUblkVM")
}

func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	t.Logf("%s %s (%s)", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func sysfs(t *testing.T, dev, attr string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// memberFiles makes n sparse member files of size bytes in dir.
func memberFiles(t *testing.T, dir string, n int, size int64) []string {
	t.Helper()
	var paths []string
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("m%d.img", i))
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		paths = append(paths, p)
	}
	return paths
}

// openArray creates (create) or assembles a raid10 array over member files.
func openArray(paths []string, create bool) (*raid10.Array, error) {
	var ms []raid10.Member
	for _, p := range paths {
		m, err := raid10.OpenFileMember(p)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	if create {
		return raid10.Create(ms, raid10.CreateOptions{AssumeClean: true})
	}
	return raid10.Assemble(ms, raid10.AssembleOptions{})
}

// TestInGuestAttach serves a raid10 array over ublk: the block device's limits, ext4 with
// fio verification, flush and discard reaching the backend, a detach and recovery in the
// same process with the data kept, then a delete that leaves no device.
func TestInGuestAttach(t *testing.T) {
	inGuest(t)
	if b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil {
		t.Logf("kernel.io_uring_disabled = %s", strings.TrimSpace(string(b)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if f, err := Features(ctx); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("kernel ublk features %#x", uint64(f))
		if f&(FlagUserRecovery|FlagUserRecoveryReissue) != FlagUserRecovery|FlagUserRecoveryReissue {
			t.Fatalf("kernel lacks user recovery with reissue: %#x", uint64(f))
		}
	}
	dir := t.TempDir()
	arr, err := openArray(memberFiles(t, dir, 4, 160<<20), true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = arr.Close() }()
	d, err := Create(ctx, arr, Options{Queues: 2})
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	defer func() {
		if !deleted {
			_ = d.Delete(ctx)
		}
	}()
	dev := d.Path()
	if d.Info().Flags&(FlagUserRecovery|FlagUserRecoveryReissue) != FlagUserRecovery|FlagUserRecoveryReissue || !d.Info().Ours() {
		t.Fatalf("device info %+v", d.Info())
	}
	for attr, want := range map[string]string{
		"max_sectors_kb":      "1024",
		"logical_block_size":  "4096",
		"physical_block_size": "4096",
		"write_cache":         "write back",
		"fua":                 "1",
	} {
		if got := sysfs(t, dev, attr); got != want {
			t.Errorf("%s: %s = %q, want %q", dev, attr, got, want)
		}
	}
	if got := sysfs(t, dev, "discard_max_bytes"); got == "0" {
		t.Errorf("%s: discard_max_bytes 0, want discard advertised", dev)
	}
	t.Logf("%s: size %s sectors, scheduler %s, nr_requests %s", dev,
		strings.TrimSpace(sh(t, "blockdev", "--getsz", dev)), sysfs(t, dev, "scheduler"), sysfs(t, dev, "nr_requests"))

	mnt := filepath.Join(dir, "mnt")
	_ = os.Mkdir(mnt, 0o755)
	sh(t, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev)
	sh(t, "mount", dev, mnt)
	out := sh(t, "fio", "--name=verify", "--filename="+filepath.Join(mnt, "fio.dat"), "--size=8M",
		"--bs=4k", "--rw=randwrite", "--ioengine=libaio", "--iodepth=32", "--direct=1",
		"--verify=crc32c", "--verify_state_save=0", "--do_verify=1", "--verify_fatal=1")
	if !strings.Contains(out, "err= 0") {
		t.Fatalf("fio:\n%s", out)
	}
	// 1 MiB requests arrive whole.
	out = sh(t, "fio", "--name=big", "--filename="+filepath.Join(mnt, "big.dat"), "--size=16M",
		"--bs=1M", "--rw=write", "--ioengine=libaio", "--iodepth=4", "--direct=1",
		"--verify=crc32c", "--verify_state_save=0", "--do_verify=1", "--verify_fatal=1")
	if !strings.Contains(out, "err= 0") {
		t.Fatalf("fio 1M:\n%s", out)
	}
	sh(t, "sync")
	sh(t, "fstrim", "-v", mnt)
	st := d.Stats()
	t.Logf("stats %+v", st)
	if st.Flushes == 0 || st.Discards == 0 || st.Errors != 0 || st.Writes == 0 || st.Reads == 0 {
		t.Errorf("backend saw %+v: want flushes, discards, reads and writes, no errors", st)
	}
	if avg := st.BytesWritten / st.Writes; avg < 64<<10 {
		t.Logf("average write %d bytes", avg) // logged: ext4's own writes are small
	}
	sh(t, "umount", mnt)

	// A detach leaves the device waiting; Recover in the same process takes it over.
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(dir, "pattern"), want, 0o600); err != nil {
		t.Fatal(err)
	}
	sh(t, "dd", "if="+filepath.Join(dir, "pattern"), "of="+dev, "bs=1M", "seek=100", "oflag=direct", "conv=fsync")
	d.Detach()
	if info, err := GetInfo(ctx, d.ID()); err != nil {
		t.Fatalf("after detach: %v", err)
	} else {
		t.Logf("after detach: state %s", info.State)
	}
	start := time.Now()
	d, err = Recover(ctx, d.ID(), arr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered %s in %s", d.Path(), time.Since(start).Round(time.Millisecond))
	noKernelWarning(t)
	got := filepath.Join(dir, "got")
	sh(t, "dd", "if="+dev, "of="+got, "bs=1M", "skip=100", "count=1", "iflag=direct")
	if b, err := os.ReadFile(got); err != nil || string(b) != string(want) {
		t.Fatalf("data read back after recovery differs (%v)", err)
	}
	sh(t, "e2fsck", "-fn", dev)

	if err := d.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("%s still there after Delete: %v", dev, err)
	}
	if ids, err := List(); err != nil || slices.Contains(ids, d.ID()) {
		t.Errorf("after Delete: devices %v %v", ids, err)
	}
	if err := Delete(ctx, d.ID()); err != nil {
		t.Errorf("Delete of a missing device: %v", err)
	}
}

// noKernelWarning fails t when the kernel log has a WARNING (a recovery started while the
// old queue threads were not exiting warns in ublk_drv).
func noKernelWarning(t *testing.T) {
	t.Helper()
	out, _ := exec.Command("dmesg").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "WARNING:") {
			t.Errorf("kernel: %s", l)
		}
	}
}

// helper is the serving process of TestInGuestKill9: the test binary run again.
type helper struct {
	cmd   *exec.Cmd
	id    int
	how   string
	lines chan string
}

func startHelper(t *testing.T, dir string, id int) *helper {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=serve", "UBLK_HELPER_DIR="+dir, fmt.Sprintf("UBLK_HELPER_ID=%d", id))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	select {
	case l, ok := <-h.lines:
		if !ok || !strings.HasPrefix(l, "READY ") {
			t.Fatalf("helper said %q", l)
		}
		_, _ = fmt.Sscanf(l, "READY %d %s", &h.id, &h.how)
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("helper not ready after 90s")
	}
	return h
}

// serveHelper serves the raid10 array of UBLK_HELPER_DIR: it creates it and its device
// when UBLK_HELPER_ID is -1, else assembles it and recovers that device. SIGTERM deletes
// the device.
func serveHelper() int {
	dir := os.Getenv("UBLK_HELPER_DIR")
	var id int
	_, _ = fmt.Sscanf(os.Getenv("UBLK_HELPER_ID"), "%d", &id)
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "helper:", err); return 1 }
	paths, _ := filepath.Glob(filepath.Join(dir, "m*.img"))
	arr, err := openArray(paths, id < 0)
	if err != nil {
		return fail(err)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var d *Device
	how := "created"
	if id < 0 {
		d, err = Create(ctx, arr, Options{})
	} else {
		d, err = Recover(ctx, id, arr)
		how = "recovered"
	}
	if err != nil {
		return fail(err)
	}
	fmt.Printf("READY %d %s\n", d.ID(), how)
	<-term
	if err := d.Delete(context.Background()); err != nil {
		return fail(err)
	}
	if err := arr.Close(); err != nil {
		return fail(err)
	}
	fmt.Println("DELETED")
	return 0
}

var clatMax = regexp.MustCompile(`clat \(([mu]?sec)\): min=[^,]+, max=\s*([0-9.]+)([kKmM]?)`)

// TestInGuestKill9 is the restart test: fio writes with verification through ext4 on the
// device while the serving process is killed with SIGKILL and started again, several times;
// the new process recovers the device. fio must see no error, its verification must pass,
// e2fsck must find the filesystem clean. The stall (kill to recovered, and fio's slowest
// write) is logged, not asserted.
func TestInGuestKill9(t *testing.T) {
	inGuest(t)
	const kills = 3
	dir := t.TempDir()
	memberFiles(t, dir, 4, 96<<20)
	h := startHelper(t, dir, -1)
	defer func() {
		if h.cmd.ProcessState == nil {
			_ = h.cmd.Process.Kill()
			_ = h.cmd.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = Delete(ctx, h.id)
		}
	}()
	if h.how != "created" {
		t.Fatalf("first start: %s", h.how)
	}
	id := h.id
	dev := BlockPath(id)
	mnt := filepath.Join(dir, "mnt")
	_ = os.Mkdir(mnt, 0o755)
	sh(t, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev)
	sh(t, "mount", dev, mnt)
	mounted := true
	defer func() {
		if mounted {
			_ = exec.Command("umount", "-l", mnt).Run()
		}
	}()

	fio := exec.Command("fio", "--name=kill9", "--filename="+filepath.Join(mnt, "fio.dat"),
		"--size=16M", "--bs=4k", "--rw=randwrite", "--ioengine=libaio", "--iodepth=8",
		"--direct=1", "--rate_iops=500", "--verify=crc32c", "--verify_state_save=0", "--do_verify=1", "--verify_fatal=1")
	var fioOut strings.Builder
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	start := time.Now()
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()

	during := 0
	for i := 0; i < kills; i++ {
		time.Sleep(1500 * time.Millisecond)
		select {
		case err := <-fioDone:
			fioDone <- err
			t.Logf("fio ended before kill %d", i+1)
		default:
			during++
		}
		killAt := time.Now()
		_ = h.cmd.Process.Signal(syscall.SIGKILL)
		_ = h.cmd.Wait()
		h = startHelper(t, dir, id)
		t.Logf("kill %d at %s into fio: device %d %s, %s after the kill", i+1,
			killAt.Sub(start).Round(time.Millisecond), h.id, h.how, time.Since(killAt).Round(time.Millisecond))
		if h.how != "recovered" || h.id != id {
			t.Fatalf("restart %d: device %d %s, want %d recovered", i+1, h.id, h.how, id)
		}
	}
	var ferr error
	select {
	case ferr = <-fioDone:
	case <-time.After(4 * time.Minute):
		_ = fio.Process.Kill()
		t.Fatalf("fio hangs:\n%s", fioOut.String())
	}
	out := fioOut.String()
	t.Logf("fio took %s, %d of %d kills while it wrote", time.Since(start).Round(time.Millisecond), during, kills)
	if m := clatMax.FindAllStringSubmatch(out, -1); m != nil {
		for _, x := range m {
			t.Logf("fio completion latency max: %s %s%s", x[2], x[3], x[1])
		}
	}
	if ferr != nil || !strings.Contains(out, "err= 0") || strings.Contains(out, "verify:") {
		t.Fatalf("fio failed across restarts: %v\n%s", ferr, out)
	}
	if during < kills-1 {
		t.Fatalf("only %d kills happened while fio wrote", during)
	}
	sh(t, "umount", mnt)
	mounted = false
	sh(t, "e2fsck", "-fn", dev)
	noKernelWarning(t)
	if out, _ := exec.Command("dmesg").Output(); len(out) > 0 {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "ublk") || strings.Contains(l, "I/O error") || strings.Contains(l, "EXT4-fs error") {
				t.Log("dmesg: " + l)
			}
		}
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	var rest []string
	for l := range h.lines {
		rest = append(rest, l)
	}
	if err := h.cmd.Wait(); err != nil || !slices.Contains(rest, "DELETED") {
		t.Fatalf("helper delete: %v %q", err, rest)
	}
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", dev, err)
	}
}
