package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
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

// Require skips the test inside the VM (a host-side test never recurses), and in -short
// mode and with RAID10_SKIP_HEAVY; when the VM cannot be booted here it ends the test
// through testenv.Missing: a failure under CI, a skip elsewhere.
func Require(t testing.TB) {
	t.Helper()
	HostHalf(t)
	testenv.Heavy(t, "vm: QEMU tests are slow")
	if err := Available(); err != nil {
		testenv.Missing(t, "vm: %v; run `make deps` to install QEMU and a kernel", err)
	}
}

// HostHalf skips the host half of a host/VM pair (the test that boots the VM) when it
// runs inside the VM.
func HostHalf(t testing.TB) {
	t.Helper()
	if InGuest() {
		testenv.Skip(t, testenv.KindGuest, "vm: already inside the test VM")
	}
}

// GuestHalf skips the in-guest half of a host/VM pair on the host; driver names the host
// test that runs it in the VM (and requires its PASS there, see Options.Tests).
func GuestHalf(t testing.TB, driver string) {
	t.Helper()
	if !InGuest() {
		testenv.Skip(t, testenv.KindGuest, "runs in the VM (%s)", driver)
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
// as is), boots the VM with opts, runs the binary there with args (e.g.
// "-test.run=^TestInKernel") in the package's directory, streams its output to
// t.Log line by line, and fails t when the VM failed or the binary exited non-zero.
//
// A zero exit status is not enough: it also fails t unless every test of opts.Tests
// (or of a plain -test.run list) reported "--- PASS" in the guest, no test or subtest
// was skipped there, and the binary did not warn "no tests to run". So a renamed
// in-guest test, or one that skips in the guest, cannot pass as its host half.
// -test.v is added when args lack it.
//
// Calls Require first. The binary runs as root in the guest with opts.Env, plus
// RAID10_IN_VM=1 (see InGuest; GuestHalf skips the in-guest half on the host) and the
// host's CI variable (a missing tool in the guest fails under CI too). Build flags
// (e.g. "-race") come from opts.BuildFlags.
func RunGoTestOpts(t testing.TB, opts Options, pkg string, args ...string) *Result {
	t.Helper()
	Require(t)
	if opts.KernelSeries != "" {
		if _, err := FindKernelSeries(opts.KernelSeries); err != nil {
			testenv.Missing(t, "vm: %v; run `make deps`", err)
		}
	}
	args, tests, err := guestTestArgs(opts.Tests, args)
	if err != nil {
		t.Fatalf("vm: %s: %v", pkg, err)
	}
	if ci, ok := os.LookupEnv("CI"); ok {
		opts.Env = append([]string{"CI=" + ci}, opts.Env...)
	}
	ctx := context.Background()
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, dl.Add(-5*time.Second))
			defer cancel()
		}
	}

	bin, dir, cleanup, err := buildGoTestOnce(ctx, pkg, opts.BuildFlags...)
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
	if err := checkGuestTests(res.Output, tests); err != nil {
		t.Fatalf("vm: %s in the guest: %v", filepath.Base(bin), err)
	}
	return res
}

// guestTestArgs returns the test binary's arguments (with -test.v, and with -test.run
// built from tests when args have none) and the tests that must pass: tests, or else the
// names of a plain -test.run list.
func guestTestArgs(tests, args []string) ([]string, []string, error) {
	run, verbose := "", false
	for i, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch name {
		case "test.run", "run":
			if !hasVal && i+1 < len(args) {
				val = args[i+1]
			}
			run = val
		case "test.v", "v":
			verbose = !hasVal || val != "false"
		}
	}
	if len(tests) == 0 {
		names, ok := plainTests(run)
		if !ok {
			return nil, nil, fmt.Errorf("name the in-guest tests that must pass in Options.Tests "+
				"(-test.run %q is not a plain list such as ^TestA$ or ^(TestA|TestB)$)", run)
		}
		tests = names
	}
	out := append([]string(nil), args...)
	if run == "" {
		out = append(out, "-test.run=^("+strings.Join(tests, "|")+")$")
	}
	if !verbose {
		out = append(out, "-test.v")
	}
	return out, tests, nil
}

var (
	// plainRun matches a -test.run pattern that names whole top-level tests only.
	plainRun = regexp.MustCompile(`^\^\(?([A-Za-z0-9_]+(?:\|[A-Za-z0-9_]+)*)\)?\$$`)
	// testResult matches the result line of a test or subtest in -test.v output.
	testResult = regexp.MustCompile(`--- (PASS|FAIL|SKIP): (\S+) \([0-9.]+s\)`)
)

// plainTests returns the test names of a -test.run pattern that is a plain list:
// ^Name$, ^(A|B)$, or ^A$|^B$.
func plainTests(run string) ([]string, bool) {
	if !strings.HasPrefix(run, "^") || !strings.HasSuffix(run, "$") {
		return nil, false
	}
	var names []string
	for _, alt := range strings.Split(run[1:len(run)-1], "$|^") {
		alt = "^" + alt + "$"
		m := plainRun.FindStringSubmatch(alt)
		if m == nil || strings.HasPrefix(alt, "^(") != strings.HasSuffix(alt, ")$") {
			return nil, false
		}
		names = append(names, strings.Split(m[1], "|")...)
	}
	return names, len(names) > 0
}

// checkGuestTests checks a test binary's -test.v output: every test in tests reported
// "--- PASS", no test or subtest reported "--- SKIP" (the guest is where in-guest tests
// must run; exclude one that is driven by another test with -test.skip), and the binary
// did not warn that it had no tests to run.
func checkGuestTests(output string, tests []string) error {
	var errs []error
	if strings.Contains(output, "testing: warning: no tests to run") {
		errs = append(errs, errors.New(`"testing: warning: no tests to run": -test.run matches no test`))
	}
	if len(tests) == 0 {
		errs = append(errs, errors.New("no in-guest tests named"))
	}
	result := map[string]string{}
	var skipped []string
	for _, m := range testResult.FindAllStringSubmatch(output, -1) {
		status, name := m[1], m[2]
		top, _, _ := strings.Cut(name, "/")
		if top == name {
			result[name] = status
		}
		if status == "SKIP" {
			skipped = append(skipped, name)
		}
	}
	for _, name := range tests {
		switch result[name] {
		case "PASS":
		case "":
			errs = append(errs, fmt.Errorf("%s did not run (no --- PASS line: renamed, or not matched by -test.run?)", name))
		default:
			errs = append(errs, fmt.Errorf("%s: --- %s, want --- PASS", name, result[name]))
		}
	}
	if len(skipped) > 0 {
		errs = append(errs, fmt.Errorf("skipped in the guest, where they must run: %s", strings.Join(skipped, ", ")))
	}
	return errors.Join(errs...)
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
	build := GoCommand(ctx, "test", append(append([]string{"-c", "-o", bin}, flags...), pkg)...)
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

// GoCommand returns the command `go <verb> <args...>` for a test that builds a binary
// (verb "build", or "test" with -c). A build without -race in args runs with CGO_ENABLED=0
// and -trimpath: the flags of the plugin image (hack/image.sh, the Dockerfile) and of `make
// lint`, so that every non-race build of a run (test binaries for the guest, plugins,
// images, lint's export data) compiles each package once. With other flags each set
// compiled the Kubernetes client libraries again: a cold run compiled them in three
// configurations (issue 24). A -race build keeps cgo, which the race detector needs; its
// compiles are those of `go test -race`.
func GoCommand(ctx context.Context, verb string, args ...string) *exec.Cmd {
	if slices.Contains(args, "-race") {
		return exec.CommandContext(ctx, "go", append([]string{verb}, args...)...)
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{verb, "-trimpath"}, args...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}
