package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// The in-guest tests run as root in a QEMU guest booted with the 6.12 kernel (ublk_drv) or
// the newest (TestUblkNewestVM); on the host they skip, and TestUblkVM runs them there.

const helperEnv = "UBLK_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "serve" {
		os.Exit(serveHelper())
	}
	// The tests run on other goroutines; this one, on the main thread (see init in
	// mainthread_test.go), runs what they send to onMainThread.
	code := make(chan int, 1)
	go func() { code <- m.Run() }()
	for {
		select {
		case f := <-mainThreadFuncs:
			f()
		case c := <-code:
			os.Exit(c)
		}
	}
}

// TestUblkVM boots the 6.12 kernel and runs TestInGuestAttach, TestInGuestKill9,
// TestInGuestRing and TestInGuestControlStack there (one boot); each must pass.
func TestUblkVM(t *testing.T) {
	vm.HostHalf(t)
	vm.RunGoTestOpts(t, vm.Options{Timeout: 10 * time.Minute, Memory: 2048,
		KernelSeries: vm.UblkKernelSeries, Modules: append(slices.Clone(vm.DefaultModules), "ublk_drv"),
		Tests: []string{"TestInGuestAttach", "TestInGuestKill9", "TestInGuestRing", "TestInGuestControlStack"}},
		".", "-test.run=^TestInGuest(Attach|Kill9|Ring|ControlStack)$", "-test.v", "-test.timeout=9m")
}

func inGuest(t *testing.T) {
	t.Helper()
	vm.GuestHalf(t, "TestUblkVM")
}

// openArray creates (create) or assembles a raid10 array over member files.
func openArray(paths []string, create bool) (*raid10.Array, error) {
	ms, err := vm.OpenFileMembers(paths)
	if err != nil {
		return nil, err
	}
	if create {
		return raid10.Create(ms, raid10.CreateOptions{AssumeClean: true})
	}
	return raid10.Assemble(ms, raid10.AssembleOptions{})
}

// servedArray creates a raid10 array over four sparse member files of memberSize bytes and
// serves it on a ublk device made with opts; when t ends the device is deleted, then the
// array closed.
func servedArray(t *testing.T, ctx context.Context, memberSize int64, opts Options) (*raid10.Array, *Device) {
	t.Helper()
	arr, err := openArray(vm.SparseFiles(t, t.TempDir(), "m", 4, memberSize), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = arr.Close() })
	d, err := Create(ctx, arr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Delete(context.WithoutCancel(ctx)) })
	return arr, d
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
	features := checkKernelFeatures(t, ctx)
	dir := t.TempDir()
	arr, err := openArray(vm.SparseFiles(t, dir, "m", 4, 160<<20), true)
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
	// Online resize: a no-op at the same size where the kernel has UPDATE_SIZE, else the
	// error that says the device keeps its size.
	if err := d.Resize(ctx, arr.Size()); features.Has(FlagUpdateSize) != (err == nil) || err != nil && !errors.Is(err, ErrNoResize) {
		t.Errorf("Resize to the same size with features %s: %v", features, err)
	} else if err != nil {
		t.Logf("Resize without UPDATE_SIZE: %v", err)
	}
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
		if got := vm.QueueAttr(t, dev, attr); got != want {
			t.Errorf("%s: %s = %q, want %q", dev, attr, got, want)
		}
	}
	if got := vm.QueueAttr(t, dev, "discard_max_bytes"); got == "0" {
		t.Errorf("%s: discard_max_bytes 0, want discard advertised", dev)
	}
	t.Logf("%s: size %s sectors, scheduler %s, nr_requests %s", dev,
		strings.TrimSpace(vm.Sh(t, "blockdev", "--getsz", dev)), vm.QueueAttr(t, dev, "scheduler"), vm.QueueAttr(t, dev, "nr_requests"))

	mnt := filepath.Join(dir, "mnt")
	vm.MkfsExt4(t, dev)
	umount := vm.Mount(t, dev, mnt)
	vm.FioVerify(t, vm.FioJob{Name: "verify", File: filepath.Join(mnt, "fio.dat"), Size: "8M", IODepth: 32})
	// 1 MiB requests arrive whole.
	vm.FioVerify(t, vm.FioJob{Name: "big", File: filepath.Join(mnt, "big.dat"), Size: "16M", BS: "1M", RW: "write", IODepth: 4})
	vm.Sh(t, "sync")
	vm.Sh(t, "fstrim", "-v", mnt)
	st := d.Stats()
	t.Logf("stats %+v", st)
	if st.Flushes == 0 || st.Discards == 0 || st.Errors != 0 || st.Writes == 0 || st.Reads == 0 {
		t.Errorf("backend saw %+v: want flushes, discards, reads and writes, no errors", st)
	}
	if avg := st.BytesWritten / st.Writes; avg < 64<<10 {
		t.Logf("average write %d bytes", avg) // logged: ext4's own writes are small
	}
	umount()

	// A detach leaves the device waiting; Recover in the same process takes it over.
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(dir, "pattern"), want, 0o600); err != nil {
		t.Fatal(err)
	}
	vm.Sh(t, "dd", "if="+filepath.Join(dir, "pattern"), "of="+dev, "bs=1M", "seek=100", "oflag=direct", "conv=fsync")
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
	vm.NoKernelWarning(t)
	got := filepath.Join(dir, "got")
	vm.Sh(t, "dd", "if="+dev, "of="+got, "bs=1M", "skip=100", "count=1", "iflag=direct")
	if b, err := os.ReadFile(got); err != nil || string(b) != string(want) {
		t.Fatalf("data read back after recovery differs (%v)", err)
	}
	vm.Sh(t, "e2fsck", "-fn", dev)

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

// startHelper starts the serving process of TestInGuestKill9 (the test binary run again)
// for device id (-1: create one) and returns it with the device's id and how it got it
// (created or recovered).
func startHelper(t *testing.T, dir string, id int) (p *vm.Proc, dev int, how string) {
	t.Helper()
	p = vm.StartSelf(t, 90*time.Second, helperEnv+"=serve", "UBLK_HELPER_DIR="+dir, fmt.Sprintf("UBLK_HELPER_ID=%d", id))
	_, _ = fmt.Sscanf(p.Ready, "READY %d %s", &dev, &how)
	return p, dev, how
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
	vm.SparseFiles(t, dir, "m", 4, 96<<20)
	h, id, how := startHelper(t, dir, -1)
	t.Cleanup(func() {
		if h.Cmd.ProcessState == nil {
			h.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = Delete(ctx, id)
		}
	})
	if how != "created" {
		t.Fatalf("first start: %s", how)
	}
	dev := BlockPath(id)
	mnt := filepath.Join(dir, "mnt")
	vm.MkfsExt4(t, dev)
	umount := vm.Mount(t, dev, mnt)

	job := vm.FioJob{Name: "kill9", File: filepath.Join(mnt, "fio.dat"), Size: "16M", IODepth: 8, RateIOPS: 500}
	out := vm.FioUnderKills(t, job, kills, 1500*time.Millisecond, func(i int, into time.Duration) {
		killAt := time.Now()
		h.Kill()
		var got int
		h, got, how = startHelper(t, dir, id)
		t.Logf("kill %d at %s into fio: device %d %s, %s after the kill", i+1,
			into, got, how, time.Since(killAt).Round(time.Millisecond))
		if how != "recovered" || got != id {
			t.Fatalf("restart %d: device %d %s, want %d recovered", i+1, got, how, id)
		}
	})
	for _, x := range clatMax.FindAllStringSubmatch(out, -1) {
		t.Logf("fio completion latency max: %s %s%s", x[2], x[3], x[1])
	}
	umount()
	vm.Sh(t, "e2fsck", "-fn", dev)
	vm.NoKernelWarning(t)
	vm.LogDmesg(t, "ublk", "I/O error", "EXT4-fs error")
	rest, err := h.Stop()
	if err != nil || !slices.Contains(rest, "DELETED") {
		t.Fatalf("helper delete: %v %q", err, rest)
	}
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", dev, err)
	}
}
