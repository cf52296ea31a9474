package vm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestRunExitStatusOutputEnv: the guest command's exit status, stdout and stderr
// and the environment pass through.
func TestRunExitStatusOutputEnv(t *testing.T) {
	vm.Require(t)
	t.Parallel()
	var streamed strings.Builder
	res, err := vm.Run(context.Background(), vm.Options{
		Timeout: 3 * time.Minute,
		CPUs:    1,
		Env:     []string{"VM_TEST_VALUE=it's $quoted"},
		Modules: []string{},
		Stdout:  &streamed,
	}, `echo "value=$VM_TEST_VALUE"; echo to-stderr >&2; echo "in=$RAID10_IN_VM pwd=$(pwd)"
echo "pid1-mount-ns-root=$(nsenter --mount=/proc/1/ns/mnt -- /bin/sh -c 'test -d "$0" && echo host || echo initramfs' "$(pwd)")"
exit 7`)
	if err != nil {
		t.Fatalf("vm.Run: %v", err)
	}
	t.Logf("boot+run took %s", res.Duration.Round(time.Millisecond))
	if res.ExitCode != 7 {
		t.Errorf("ExitCode = %d, want 7; output:\n%s", res.ExitCode, res.Output)
	}
	wd, _ := os.Getwd()
	// pid1-mount-ns-root: entering PID 1's mount namespace (as Kubernetes' host-exec pods do,
	// nsenter --mount=/proc/1/ns/mnt) lands in the host root the command runs in, not the
	// initramfs (init.sh moves the host root to the namespace's /).
	for _, want := range []string{"value=it's $quoted\n", "to-stderr\n", "in=1 pwd=" + wd + "\n", "pid1-mount-ns-root=host\n"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("output lacks %q:\n%s", want, res.Output)
		}
	}
	if streamed.String() != res.Output {
		t.Errorf("streamed output %q differs from Result.Output %q", streamed.String(), res.Output)
	}
	if !strings.Contains(res.ConsoleLog, "raid10-vm:") || !strings.Contains(res.ConsoleLog, "exit status 7") {
		t.Errorf("console log lacks the init log:\n%s", res.ConsoleTail(20))
	}
}

// TestRunTimeoutKillsGuest: a hung guest is killed at the timeout and reported
// with ErrTimeout and the console tail.
func TestRunTimeoutKillsGuest(t *testing.T) {
	vm.Require(t)
	t.Parallel()
	const timeout = 15 * time.Second
	start := time.Now()
	res, err := vm.Run(context.Background(), vm.Options{Timeout: timeout, CPUs: 1, Modules: []string{}}, "sleep 3600")
	elapsed := time.Since(start)
	if !errors.Is(err, vm.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if !strings.Contains(err.Error(), "console tail") {
		t.Errorf("error does not carry the console tail: %v", err)
	}
	if res == nil || res.ExitCode != -1 {
		t.Errorf("result = %+v, want ExitCode -1", res)
	}
	if elapsed > timeout+15*time.Second {
		t.Errorf("Run returned after %s, timeout was %s", elapsed, timeout)
	}
	t.Logf("killed after %s: %v", elapsed.Round(time.Millisecond), err)
}

// TestRunGoTest runs this package's own test binary in the guest (the in-guest
// half is TestInGuest below) with an environment variable and a writable host
// directory under /tmp.
func TestRunGoTest(t *testing.T) {
	vm.Require(t)
	out := t.TempDir()
	kernel, err := vm.FindKernel()
	if err != nil {
		t.Fatal(err)
	}
	res := vm.RunGoTestOpts(t, vm.Options{
		Timeout:  4 * time.Minute,
		Env:      []string{"VM_TEST_OUT=" + out, "VM_TEST_KVER=" + kernel.Version},
		Writable: []string{out},
	}, ".", "-test.run=^TestInGuest$", "-test.v", "-test.count=1")
	if !strings.Contains(res.Output, "--- PASS: TestInGuest") {
		t.Fatalf("RunGoTestOpts returned, but the in-guest test did not pass:\n%s", res.Output)
	}
	b, err := os.ReadFile(filepath.Join(out, "from-guest"))
	if err != nil || string(b) != kernel.Version {
		t.Fatalf("file written by the guest: %q, %v; want %q", b, err, kernel.Version)
	}
}

// TestInGuest is the in-guest half of TestRunGoTest; on the host it skips.
func TestInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestRunGoTest")
	rel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(rel)), os.Getenv("VM_TEST_KVER"); got != want {
		t.Errorf("guest kernel %q, want %q", got, want)
	}
	for _, dev := range []string{"/dev/nbd0", "/dev/ram0", "/dev/nullb0"} {
		if _, err := os.Stat(dev); err != nil {
			t.Errorf("%s: %v", dev, err)
		}
	}
	mdstat, err := os.ReadFile("/proc/mdstat")
	if err != nil || !strings.Contains(string(mdstat), "[raid10]") {
		t.Errorf("/proc/mdstat = %q, %v; want raid10 personality", mdstat, err)
	}
	if err := os.WriteFile(filepath.Join(os.Getenv("VM_TEST_OUT"), "from-guest"), []byte(strings.TrimSpace(string(rel))), 0o644); err != nil {
		t.Errorf("write to the writable share: %v", err)
	}
}

// fatalRecorder is a testing.TB whose Fatal records the message and ends the call
// (panicking with errFatal) instead of failing the test.
type fatalRecorder struct {
	testing.TB
	fatal string
}

var errFatal = errors.New("fatal recorded")

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(errFatal)
}
func (r *fatalRecorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// TestRunGoTestRequiresPass: the guest binary exits 0, yet RunGoTestOpts fails because
// one expected in-guest test skipped there and the other does not exist (renamed): the
// two ways a host test passed while nothing ran in the guest.
func TestRunGoTestRequiresPass(t *testing.T) {
	vm.Require(t)
	t.Parallel()
	r := &fatalRecorder{TB: t}
	func() {
		defer func() {
			if v := recover(); v != nil && v != errFatal { //nolint:errorlint // the sentinel itself, not a wrapped error
				panic(v)
			}
		}()
		res := vm.RunGoTestOpts(r, vm.Options{Timeout: 3 * time.Minute, CPUs: 1, Modules: []string{}},
			".", "-test.run=^(TestInGuestSkips|TestInGuestRenamed)$")
		t.Errorf("RunGoTestOpts passed; guest output:\n%s", res.Output)
	}()
	if r.fatal == "" || strings.Contains(r.fatal, "exited with status") {
		t.Fatalf("RunGoTestOpts failure %q: want the guest binary to exit 0 and the output check to fail it", r.fatal)
	}
	t.Logf("RunGoTestOpts failed, as it must: %s", r.fatal)
	for _, want := range []string{"TestInGuestRenamed did not run", "skipped in the guest, where they must run: TestInGuestSkips"} {
		if !strings.Contains(r.fatal, want) {
			t.Errorf("RunGoTestOpts failure %q lacks %q", r.fatal, want)
		}
	}
}

// TestInGuestSkips is the in-guest half of TestRunGoTestRequiresPass: it skips in the
// guest too, which the wrapper must report.
func TestInGuestSkips(t *testing.T) {
	vm.GuestHalf(t, "TestRunGoTestRequiresPass")
	testenv.Skip(t, testenv.KindDriven, "stands for an in-guest test that skips in the guest (TestRunGoTestRequiresPass)")
}

// TestRunWatchdogDumpsGoStacks: a hung Go test binary is stopped by the guest-side
// watchdog with SIGQUIT, so the error carries its goroutine stacks.
func TestRunWatchdogDumpsGoStacks(t *testing.T) {
	vm.Require(t)
	t.Parallel()
	ctx := context.Background()
	bin, dir, cleanup, err := vm.BuildGoTest(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	res, err := vm.Run(ctx, vm.Options{
		Timeout:  3 * time.Minute,
		Watchdog: 5 * time.Second,
		CPUs:     1,
		Modules:  []string{},
		Dir:      dir,
		Env:      []string{"VM_TEST_HANG=1"},
	}, vm.ShellJoin(bin, "-test.run=^TestInGuestHang$", "-test.v"))
	if !errors.Is(err, vm.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout; output:\n%s", err, res.Output)
	}
	for _, want := range []string{"SIGQUIT", "TestInGuestHang"} {
		if !strings.Contains(res.Output, want) || !strings.Contains(err.Error(), want) {
			t.Errorf("output and error should show %q (a goroutine dump):\n%v", want, err)
		}
	}
	t.Logf("stopped by the guest watchdog after %s, exit status %d", res.Duration.Round(time.Millisecond), res.ExitCode)
}

// TestInGuestHang is the in-guest half of TestRunWatchdogDumpsGoStacks.
func TestInGuestHang(t *testing.T) {
	vm.GuestHalf(t, "TestRunWatchdogDumpsGoStacks")
	if os.Getenv("VM_TEST_HANG") != "1" {
		testenv.Skip(t, testenv.KindDriven, "run by TestRunWatchdogDumpsGoStacks")
	}
	time.Sleep(time.Hour) // not select{}: the runtime would report a deadlock
}

// TestRunBootFailureBootsAgain: a guest kernel that ends before the guest is ready (here
// it finds no init) never ran the command, so Run boots it again, bootAttempts (3) times
// in all, and then reports ErrNoExitStatus; the console log keeps every boot.
func TestRunBootFailureBootsAgain(t *testing.T) {
	vm.Require(t)
	t.Parallel()
	dir := t.TempDir()
	res, err := vm.Run(context.Background(), vm.Options{Timeout: 3 * time.Minute, CPUs: 1, Modules: []string{},
		RunDir: dir, KernelArgs: []string{"rdinit=/no-such-init"}}, "true")
	if !errors.Is(err, vm.ErrNoExitStatus) {
		t.Fatalf("err = %v, want ErrNoExitStatus", err)
	}
	if res.Boot != 0 {
		t.Errorf("Boot = %s, want 0: the guest never got ready", res.Boot)
	}
	b, rerr := os.ReadFile(filepath.Join(dir, "console.log"))
	if rerr != nil {
		t.Fatal(rerr)
	}
	if n := strings.Count(string(b), "Kernel panic"); n != 3 {
		t.Errorf("console.log holds %d kernel panics, want 3 (one per boot):\n%s", n, b)
	}
}

// TestRunGuestPanicReported: a kernel panic in the guest ends QEMU (panic=-1,
// -no-reboot) and is reported as ErrNoExitStatus with the panic in the console tail.
func TestRunGuestPanicReported(t *testing.T) {
	vm.Require(t)
	t.Parallel()
	res, err := vm.Run(context.Background(), vm.Options{Timeout: 3 * time.Minute, CPUs: 1, Modules: []string{}},
		"echo 1 > /proc/sys/kernel/sysrq; echo c > /proc/sysrq-trigger; sleep 60")
	if !errors.Is(err, vm.ErrNoExitStatus) {
		t.Fatalf("err = %v, want ErrNoExitStatus", err)
	}
	if !strings.Contains(err.Error(), "Kernel panic") {
		t.Errorf("error lacks the panic from the console:\n%v", err)
	}
	t.Logf("panicked guest reported after %s", res.Duration.Round(time.Millisecond))
}
