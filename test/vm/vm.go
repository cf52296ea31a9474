package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Sentinel errors of Run. A non-zero exit status of the guest command is not an
// error: it is Result.ExitCode.
var (
	// ErrTimeout: the guest did not finish within Options.Timeout (or the context
	// ended); QEMU was killed.
	ErrTimeout = errors.New("vm: guest timed out")
	// ErrNoExitStatus: QEMU ended without the guest reporting the command's exit
	// status (kernel panic, init failure, crash).
	ErrNoExitStatus = errors.New("vm: guest reported no exit status")
)

// qbootROM is QEMU's minimal firmware (Debian package qemu-system-data).
const qbootROM = "/usr/share/qemu/qboot.rom"

// InGuestEnv is set to "1" in the environment of every command run in the guest.
const InGuestEnv = "RAID10_IN_VM"

// RunDirEnv names the run directory (read-write, same path on host and guest).
const RunDirEnv = "RAID10_VM_RUNDIR"

// DefaultModules are loaded (with the host's modprobe) before the command runs.
var DefaultModules = []string{"nbd", "md_mod", "raid0", "raid1", "raid10", "brd", "null_blk", "loop", "ext4", "xfs"}

// Options configure one guest boot. The zero value is usable.
type Options struct {
	// KernelSeries selects the kernel booted by its series, e.g. UblkKernelSeries
	// (default: FindKernel's choice).
	KernelSeries string
	// Memory in MiB (default 2048).
	Memory int
	// CPUs is the number of virtual CPUs (default 2).
	CPUs int
	// Timeout bounds the whole boot, command and power-off (default 10 minutes).
	// From 90 s on, the guest also sends the command SIGQUIT (a Go binary then
	// prints all goroutine stacks) and SIGKILL at Timeout less 60 s, so that
	// ErrTimeout comes with the command's output instead of a killed QEMU.
	Timeout time.Duration
	// Watchdog overrides that guest-side limit on the command (whole seconds;
	// negative: none).
	Watchdog time.Duration
	// Env is added to the guest command's environment, as "KEY=value".
	// The guest also gets PATH and HOME=/tmp, RAID10_IN_VM=1 and RAID10_VM_RUNDIR.
	Env []string
	// Dir is the guest command's working directory (default: the host's current
	// directory). The whole host root is visible read-only in the guest at the same
	// paths, except /tmp, /run, /var/tmp and /dev, which are fresh in the guest; a
	// Dir there is shared read-write automatically.
	Dir string
	// Writable lists host directories shared read-write with the guest at the same
	// path (e.g. t.TempDir()). The run directory always is.
	Writable []string
	// Modules to load before the command instead of DefaultModules (names for
	// modprobe). ModuleParams gives a module its parameters, e.g.
	// {"brd": "rd_nr=4 rd_size=65536"}.
	Modules      []string
	ModuleParams map[string]string
	// Stdout, if set, receives the guest command's output while it runs.
	Stdout io.Writer
	// Console, if set, receives the guest serial console while it runs.
	Console io.Writer
	// KernelArgs are appended to the kernel command line.
	KernelArgs []string
	// NoExitSync makes the guest power off without syncing every filesystem after the
	// command (which syncs what it keeps itself): a guest whose filesystems sit on
	// devices served by processes that have ended (the cluster node's NBD volumes after
	// its pods stopped) would wait in that sync until the host kills QEMU 30 s after
	// the exit status (test/cluster's reboot: 58 s to stop the node; issue 24).
	NoExitSync bool
	// KeepRunDir leaves the run directory (script, output, console.log) in place.
	KeepRunDir bool
	// RunDir, if set, is used as the run directory instead of a fresh one under
	// CacheDir()/runs; it is then never removed.
	RunDir string
	// BuildFlags are passed to `go test -c` by RunGoTest (e.g. "-race").
	BuildFlags []string
	// Disks are raw image files attached as block devices, in order.
	Disks []Disk
	// Net, if set, gives the guest one virtio NIC (eth0, module virtio_net) on QEMU user
	// networking with restrict=on: the guest reaches nothing outside but Net.GuestFwd. The
	// guest configures eth0 itself (10.0.2.15/24, gateway 10.0.2.2: QEMU's defaults).
	Net *Net
	// Tests names the in-guest tests (top-level test functions) that RunGoTestOpts
	// requires to report "--- PASS" in the guest's output. Empty: taken from a
	// -test.run argument that is a plain list (^Name$, ^(A|B)$ or ^A$|^B$). Set and no
	// -test.run given: the binary runs exactly these.
	Tests []string
}

// Disk is one raw image file attached to the guest.
type Disk struct {
	// File is the raw image on the host (created and sized by the caller).
	File string
	// NVMe attaches it as an emulated NVMe controller with one namespace (/dev/nvmeXn1,
	// modules nvme and nvme_core); otherwise as virtio-blk (/dev/vdX, module virtio_blk).
	NVMe bool
	// Serial is the NVMe serial number (/sys/block/nvmeXn1/device/serial) or the
	// virtio-blk serial; empty: QEMU's default.
	Serial string
}

// Net is the guest's restricted user-mode network.
type Net struct {
	// Network is QEMU's net= (default 10.0.2.0/24); the guest's address is .15 in it, the
	// gateway .2.
	Network string
	// GuestFwd maps a guest TCP address (IP:port in Network, not .2, .3 or .15) to a
	// host command run once per connection with the connection on its stdin and stdout,
	// e.g. {"10.0.2.100:6443": "socat - TCP:127.0.0.1:36443"}.
	GuestFwd map[string]string
}

// deviceArgs returns the -drive/-device and -netdev arguments of the disks and the network.
func (o Options) deviceArgs() ([]string, error) {
	var args []string
	for i, d := range o.Disks {
		if d.File == "" || strings.ContainsAny(d.File, ",") || strings.ContainsAny(d.Serial, ", ") {
			return nil, fmt.Errorf("vm: disk %d: file %q, serial %q: a file is required, no commas or spaces", i, d.File, d.Serial)
		}
		id := fmt.Sprintf("disk%d", i)
		args = append(args, "-drive", fmt.Sprintf("file=%s,if=none,id=%s,format=raw,cache=unsafe,aio=threads", d.File, id))
		dev := "virtio-blk-pci,drive=" + id
		if d.NVMe {
			dev = "nvme,drive=" + id
		}
		if d.Serial != "" {
			dev += ",serial=" + d.Serial
		}
		args = append(args, "-device", dev)
	}
	if o.Net != nil {
		nd := "user,id=net0,restrict=on"
		if o.Net.Network != "" {
			nd += ",net=" + o.Net.Network
		}
		keys := make([]string, 0, len(o.Net.GuestFwd))
		for k := range o.Net.GuestFwd {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			c := o.Net.GuestFwd[k]
			if strings.Contains(c, ",") || strings.Contains(k, ",") {
				return nil, fmt.Errorf("vm: guestfwd %s=%q: no commas", k, c)
			}
			nd += ",guestfwd=tcp:" + k + "-cmd:" + c
		}
		args = append(args, "-netdev", nd, "-device", "virtio-net-pci,netdev=net0")
	}
	return args, nil
}

// Result of one guest boot.
type Result struct {
	// Output is the guest command's stdout and stderr, interleaved.
	Output string
	// ExitCode is the command's exit status, -1 if it was not reported.
	ExitCode int
	// ConsoleLog is the serial console: firmware, kernel messages, init's log.
	ConsoleLog string
	// Duration is the wall time from starting QEMU to its exit.
	Duration time.Duration
	// Boot is the wall time from starting QEMU until the guest was ready to run
	// the command (modules loaded, shares mounted); zero if it never was.
	Boot time.Duration
	// Kernel that was booted.
	Kernel Kernel
	// RunDir is the run directory (gone unless Options.KeepRunDir or Options.RunDir).
	RunDir string
}

// ConsoleTail returns the last n lines of the console log, preceded by the
// earlier lines that tell what went wrong (kernel panic, BUG, Oops, WARNING, hung
// task, init FATAL), which a long stack trace would otherwise push out of the tail.
func (r *Result) ConsoleTail(n int) string {
	lines := strings.Split(strings.TrimRight(r.ConsoleLog, "\n"), "\n")
	if len(lines) <= n {
		return strings.Join(lines, "\n")
	}
	var notable []string
	for _, l := range lines[:len(lines)-n] {
		if consoleNotable.MatchString(l) && len(notable) < 10 {
			notable = append(notable, l)
		}
	}
	tail := strings.Join(lines[len(lines)-n:], "\n")
	if len(notable) == 0 {
		return tail
	}
	return strings.Join(notable, "\n") + "\n[...]\n" + tail
}

var consoleNotable = regexp.MustCompile(`Kernel panic|BUG:|Oops|WARNING:|blocked for more than|raid10-vm: FATAL|raid10-vm\(host\)`)

// Run boots the guest, runs script with /bin/sh inside the chroot of the host root,
// and powers off. It returns an error (wrapping ErrTimeout or ErrNoExitStatus, with
// the console tail in its text) only when the harness or the guest failed; the
// command's own failure is Result.ExitCode != 0. The result is non-nil whenever
// QEMU was started.
func Run(ctx context.Context, opts Options, script string) (*Result, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	k, err := FindKernelSeries(o.KernelSeries)
	if err != nil {
		return nil, err
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("vm: qemu-system-x86_64 not found (run `make deps`): %w", err)
	}
	initrd, err := BuildInitramfs(ctx, k)
	if err != nil {
		return nil, err
	}

	runDir := o.RunDir
	if runDir == "" {
		base := filepath.Join(CacheDir(), "runs")
		if err := os.MkdirAll(base, 0o755); err != nil {
			return nil, err
		}
		removeStale(base, "run-*", 24*time.Hour)
		if runDir, err = os.MkdirTemp(base, "run-"); err != nil {
			return nil, err
		}
		if !o.KeepRunDir {
			defer func() { _ = os.RemoveAll(runDir) }()
		}
	} else if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	if runDir, err = filepath.Abs(runDir); err != nil {
		return nil, err
	}
	for _, f := range []string{"output", "exit", "exit.tmp", "timedout", "console.log"} {
		_ = os.Remove(filepath.Join(runDir, f)) // leftovers of a reused RunDir
	}
	if k.Root != "" && hiddenInGuest(k.Root) {
		// A cache under /tmp: the guest sees the kernel's modules through a share.
		o.Writable = append(o.Writable, k.Root)
	}
	if err := writeRunFiles(runDir, o, k, script); err != nil {
		return nil, err
	}

	args := []string{
		"-accel", "tcg,thread=multi", "-cpu", "max", "-machine", "pc",
		"-m", strconv.Itoa(o.Memory), "-smp", strconv.Itoa(o.CPUs),
		"-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
		"-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
		"-kernel", BootImage(ctx, k), "-initrd", initrd,
		"-append", strings.Join(append([]string{"console=ttyS0", "panic=-1", "loglevel=5", "mitigations=off", "random.trust_cpu=on", "tsc=reliable"}, o.KernelArgs...), " "),
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + runDir + ",mount_tag=vmrun,security_model=none,multidevs=remap",
		"-device", "virtio-rng-pci",
	}
	devArgs, err := o.deviceArgs()
	if err != nil {
		return nil, err
	}
	args = append(args, devArgs...)
	if _, err := os.Stat(qbootROM); err == nil {
		// qboot: a minimal firmware that boots a -kernel faster than SeaBIOS.
		args = append(args, "-bios", qbootROM)
	}
	for i, w := range o.writableShares() {
		args = append(args, "-virtfs", fmt.Sprintf("local,path=%s,mount_tag=rw%d,security_model=none,multidevs=remap", w, i+1))
	}

	for attempt := 1; ; attempt++ {
		res, hung, err := o.boot(ctx, qemu, args, runDir, k)
		if !hung || attempt == bootAttempts {
			return res, err
		}
		for _, f := range []string{"output", "exit", "exit.tmp", "timedout"} {
			_ = os.Remove(filepath.Join(runDir, f))
		}
	}
}

// Boots that fail before the command starts: under TCG a guest kernel has been seen to
// stop early in boot (the console ends a second into the kernel's messages and nothing
// more comes) and, with 6.12, to oops on an int3 while patching its own text (then
// panic=-1 ends QEMU); one boot in dozens, under load. Run kills a guest that has not
// reported ready (modules loaded, shares mounted; 9-24 s normally) within bootLimit,
// and boots again after either failure, at most bootAttempts boots in all. The command
// has not started then, so nothing runs twice.
const (
	bootLimit    = 5 * time.Minute
	bootAttempts = 3
)

// boot runs QEMU once with args. hung reports a boot that failed before the guest was
// ready: killed for not reaching ready within bootLimit (only for a Timeout above twice
// bootLimit), or ended by the kernel; err then says which.
func (o Options) boot(ctx context.Context, qemu string, args []string, runDir string, k Kernel) (res *Result, hung bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		// QEMU runs in its own process group: kill all of it.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 10 * time.Second
	cmd.Stdin = nil
	// Appended to: a boot that hung stays in the file before the next one.
	consoleFile, err := os.OpenFile(filepath.Join(runDir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = consoleFile.Close() }()
	console := &syncBuffer{marker: []byte("] ready\n")}
	sinks := []io.Writer{console, consoleFile}
	if o.Console != nil {
		sinks = append(sinks, o.Console)
	}
	cw := io.MultiWriter(sinks...)
	cmd.Stdout = cw
	cmd.Stderr = cw

	res = &Result{ExitCode: -1, Kernel: k, RunDir: runDir}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, false, fmt.Errorf("vm: start qemu: %w", err)
	}
	var bootHung atomic.Bool
	tailDone := make(chan struct{})
	stopTail := make(chan struct{})
	var output []byte
	go func() {
		defer close(tailDone)
		output = followFile(filepath.Join(runDir, "output"), o.Stdout, stopTail)
	}()
	go func() {
		// Once the guest reported its exit status, QEMU has 30 s to power off;
		// a guest stuck in poweroff must not turn a finished run into a timeout.
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		exitFile := filepath.Join(runDir, "exit")
		for {
			select {
			case <-stopTail:
				return
			case <-tick.C:
			}
			if o.Timeout > 2*bootLimit && time.Since(start) > bootLimit && !console.marked() {
				bootHung.Store(true)
				_, _ = fmt.Fprintf(console, "\nraid10-vm(host): guest not ready %s after start; killing qemu to boot again\n", bootLimit)
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				return
			}
			if _, err := os.Stat(exitFile); err != nil {
				continue
			}
			select {
			case <-stopTail:
			case <-time.After(30 * time.Second):
				_, _ = fmt.Fprintf(console, "\nraid10-vm(host): guest did not power off 30 s after reporting its exit status; killing qemu\n")
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			}
			return
		}
	}()
	waitErr := cmd.Wait()
	res.Duration = time.Since(start)
	close(stopTail)
	<-tailDone
	res.Output = string(output)
	res.ConsoleLog = console.String()
	if !console.markerAt.IsZero() {
		res.Boot = console.markerAt.Sub(start)
	}
	if bootHung.Load() {
		return res, true, fmt.Errorf("%w: not ready %s after start (boot %d of %d hung); console tail:\n%s",
			ErrTimeout, bootLimit, bootAttempts, bootAttempts, res.ConsoleTail(40))
	}

	// The exit file decides: a guest that reported its status and was then killed
	// while powering off still ran its command to the end.
	b, readErr := os.ReadFile(filepath.Join(runDir, "exit"))
	code, convErr := strconv.Atoi(strings.TrimSpace(string(b)))
	if readErr != nil || convErr != nil {
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return res, false, fmt.Errorf("%w after %s (timeout %s); qemu killed; console tail:\n%s\noutput tail:\n%s",
				ErrTimeout, res.Duration.Round(time.Millisecond), o.Timeout, res.ConsoleTail(40), tailLines(res.Output, 40))
		case ctx.Err() != nil:
			return res, false, fmt.Errorf("vm: run canceled after %s, qemu killed: %w", res.Duration.Round(time.Millisecond), ctx.Err())
		case readErr == nil:
			return res, false, fmt.Errorf("%w: bad exit file %q", ErrNoExitStatus, b)
		}
		if waitErr == nil {
			waitErr = errors.New("exited with status 0")
		}
		// QEMU ended (a kernel panic) before the guest was ready: the command never ran.
		return res, res.Boot == 0, fmt.Errorf("%w (qemu: %w); console tail:\n%s", ErrNoExitStatus, waitErr, res.ConsoleTail(40))
	}
	res.ExitCode = code
	if _, err := os.Stat(filepath.Join(runDir, "timedout")); err == nil {
		return res, false, fmt.Errorf("%w: the command ran past %s in the guest and got SIGQUIT, then SIGKILL (exit status %d); output tail:\n%s",
			ErrTimeout, o.watchdog(), code, tailLines(res.Output, 60))
	}
	return res, false, nil
}

// watchdog is how long the command may run in the guest before the guest itself
// sends it SIGQUIT (stack dumps from Go) and SIGKILL: Timeout less a minute for
// boot and power-off. Zero (no watchdog) for timeouts under 90 s.
func (o Options) watchdog() time.Duration {
	switch {
	case o.Watchdog < 0:
		return 0
	case o.Watchdog > 0:
		return o.Watchdog.Round(time.Second)
	case o.Timeout < 90*time.Second:
		return 0
	}
	return o.Timeout - 60*time.Second
}

// removeStale removes entries of dir matching pattern older than age: run
// directories left behind by killed test processes.
func removeStale(dir, pattern string, age time.Duration) {
	old, _ := filepath.Glob(filepath.Join(dir, pattern))
	for _, p := range old {
		if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > age {
			_ = os.RemoveAll(p)
		}
	}
}

func (o Options) withDefaults() (Options, error) {
	if o.Memory == 0 {
		o.Memory = 2048
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	if o.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return o, err
		}
		o.Dir = wd
	}
	var err error
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return o, err
	}
	if st, err := os.Stat(o.Dir); err != nil {
		return o, fmt.Errorf("vm: Dir: %w", err)
	} else if !st.IsDir() {
		return o, fmt.Errorf("vm: Dir %s is not a directory", o.Dir)
	}
	for i, w := range o.Writable {
		if o.Writable[i], err = filepath.Abs(w); err != nil {
			return o, err
		}
	}
	for _, p := range append([]string{o.Dir, o.RunDir}, o.Writable...) {
		if !safePath.MatchString(p) && p != "" {
			return o, fmt.Errorf("vm: path %q: only [A-Za-z0-9._/+=@-] are supported in shared paths", p)
		}
	}
	for _, e := range o.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || !envName.MatchString(k) {
			return o, fmt.Errorf("vm: bad environment entry %q (want KEY=value)", e)
		}
	}
	return o, nil
}
