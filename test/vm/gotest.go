package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// InGuest reports whether this process runs inside the test VM.
func InGuest() bool { return os.Getenv(InGuestEnv) == "1" }

// Available returns nil when the VM can be booted on this machine: QEMU, a kernel
// with its modules, a static busybox and modprobe are present.
func Available() error {
	var errs []error
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		errs = append(errs, errors.New("vm: qemu-system-x86_64 not found (Debian package qemu-system-x86)"))
	}
	if _, err := FindKernel(); err != nil {
		errs = append(errs, err)
	}
	if _, err := findBusybox(); err != nil {
		errs = append(errs, err)
	}
	if _, err := exec.LookPath("modprobe"); err != nil {
		if _, err := os.Stat("/sbin/modprobe"); err != nil {
			errs = append(errs, errors.New("vm: modprobe not found (Debian package kmod)"))
		}
	}
	return errors.Join(errs...)
}

// Require skips the test when the VM cannot be used here, or in -short mode. In CI
// (environment variable CI non-empty) a missing QEMU or kernel fails the test instead.
func Require(t testing.TB) {
	t.Helper()
	if InGuest() {
		t.Skip("vm: already inside the test VM")
	}
	if testing.Short() || os.Getenv("RAID10_SKIP_HEAVY") != "" {
		t.Skip("vm: QEMU tests are slow; skipped in -short mode and with RAID10_SKIP_HEAVY")
	}
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("vm: the VM harness is required in CI: %v", err)
		}
		t.Skipf("vm: %v; run `make deps` to install QEMU and a kernel", err)
	}
}

// RunGoTest runs a Go test binary in the VM with default Options and fails t when
// it exits non-zero. See RunGoTestOpts.
func RunGoTest(t testing.TB, pkg string, args ...string) *Result {
	t.Helper()
	return RunGoTestOpts(t, Options{}, pkg, args...)
}

// RunGoTestOpts builds the test binary of pkg with `go test -c` (pkg is a package
// pattern such as "./pkg/nbd" or an import path; an existing executable file is run
// as is), boots the VM with opts, runs the binary there with args (e.g. "-test.v",
// "-test.run=TestKernelNBD") in the package's directory, streams its output to
// t.Log line by line, and fails t when the VM failed or the binary exited non-zero.
//
// Calls Require first. The binary runs as root in the guest with opts.Env, plus
// RAID10_IN_VM=1 (see InGuest): a test can use that to run its in-guest half only
// there. Build flags (e.g. "-race") come from opts.BuildFlags.
func RunGoTestOpts(t testing.TB, opts Options, pkg string, args ...string) *Result {
	t.Helper()
	Require(t)
	ctx := context.Background()
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, dl.Add(-5*time.Second))
			defer cancel()
		}
	}

	bin, dir, cleanup, err := BuildGoTest(ctx, pkg, opts.BuildFlags...)
	if err != nil {
		t.Fatalf("vm: build test binary of %s: %v", pkg, err)
	}
	defer cleanup()
	if opts.Dir == "" {
		opts.Dir = dir
	}
	if hiddenInGuest(bin) {
		// A prebuilt binary under /tmp: share its directory.
		opts.Writable = append(opts.Writable, filepath.Dir(bin))
	}
	lw := &lineLogger{t: t}
	if opts.Stdout == nil {
		opts.Stdout = lw
	}
	start := time.Now()
	res, err := Run(ctx, opts, "exec "+ShellJoin(append([]string{bin}, args...)...))
	lw.flush()
	if err != nil {
		t.Fatalf("vm: %s: %v", pkg, err)
	}
	t.Logf("vm: %s %s in the guest (kernel %s): exit status %d; boot %s, total %s",
		filepath.Base(bin), strings.Join(args, " "), res.Kernel.Version, res.ExitCode,
		res.Boot.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if res.ExitCode != 0 {
		t.Fatalf("vm: %s exited with status %d in the guest; console tail:\n%s", filepath.Base(bin), res.ExitCode, res.ConsoleTail(20))
	}
	return res
}

// BuildGoTest builds the test binary of pkg with `go test -c [flags] pkg` under
// CacheDir()/bin (outside /tmp, which the guest mounts fresh) and returns its path,
// the package directory (go test runs a test binary there) and a function that
// removes the binary. pkg naming an existing executable file is returned as is,
// with dir "". Use it to build once and boot several VMs with Run.
func BuildGoTest(ctx context.Context, pkg string, flags ...string) (bin, dir string, cleanup func(), err error) {
	cleanup = func() {}
	if st, err := os.Stat(pkg); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		abs, err := filepath.Abs(pkg)
		if err != nil {
			return "", "", cleanup, err
		}
		return abs, "", cleanup, nil
	}
	var stderr bytes.Buffer
	list := exec.CommandContext(ctx, "go", "list", "-f", "{{.Dir}}", pkg)
	list.Stderr = &stderr
	out, err := list.Output()
	if err != nil {
		return "", "", cleanup, fmt.Errorf("go list %s: %w: %s", pkg, err, stderr.String())
	}
	dir = strings.TrimSpace(string(out))
	base := filepath.Join(CacheDir(), "bin")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", "", cleanup, err
	}
	removeStale(base, "gotest-*", 24*time.Hour)
	tmp, err := os.MkdirTemp(base, "gotest-")
	if err != nil {
		return "", "", cleanup, err
	}
	cleanup = func() { _ = os.RemoveAll(tmp) }
	bin = filepath.Join(tmp, filepath.Base(dir)+".test")
	stderr.Reset()
	build := exec.CommandContext(ctx, "go", append(append([]string{"test", "-c", "-o", bin}, flags...), pkg)...)
	build.Stderr = &stderr
	build.Stdout = &stderr
	if err := build.Run(); err != nil {
		cleanup()
		return "", "", func() {}, fmt.Errorf("go test -c %s: %w: %s", pkg, err, stderr.String())
	}
	if _, err := os.Stat(bin); err != nil {
		cleanup()
		return "", "", func() {}, fmt.Errorf("go test -c %s wrote no binary (no test files?)", pkg)
	}
	return bin, dir, cleanup, nil
}

// lineLogger writes each complete line to t.Log.
type lineLogger struct {
	mu  sync.Mutex
	t   testing.TB
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.t.Log("guest: " + string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.t.Log("guest: " + string(l.buf))
		l.buf = nil
	}
}
