package perf

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

const (
	outEnv       = "RAID10_PERF_OUT"
	runtimeEnv   = "RAID10_PERF_RUNTIME"   // seconds per fio run (default 8)
	frontendsEnv = "RAID10_PERF_FRONTENDS" // the frontends measured, comma-separated (default all)
	// kernelEnv picks the guest's kernel series: "newest" (vm.NewestKernelSeries, 7.3: ublk
	// zero copy), a series such as "6.12", or unset for vm.UblkKernelSeries.
	kernelEnv  = "RAID10_PERF_KERNEL"
	diskSize   = 1 << 30
	disks      = 4
	diskSerial = "raid10-disk"
)

// errUnavailable is what a frontend's attach wraps when the booted kernel cannot serve it.
var errUnavailable = errors.New("frontend not available in this kernel")

// fioCase is one fio job of the table.
type fioCase struct {
	name, rw, bs string
	qd           int
	large        bool // compared with the pipe copy too
}

// job is the case as a time-based fio job on dev; extra sets the runtime.
func (c fioCase) job(name, dev, size string, extra ...string) vm.FioJob {
	return vm.FioJob{Name: name, File: dev, Size: size, BS: c.bs, RW: c.rw, IODepth: c.qd,
		Extra: append([]string{"--time_based", "--randrepeat=0"}, extra...)}
}

var cases = []fioCase{
	{"4k randread QD1", "randread", "4k", 1, false},
	{"4k randread QD32", "randread", "4k", 32, false},
	{"4k randwrite QD1", "randwrite", "4k", 1, false},
	{"4k randwrite QD32", "randwrite", "4k", 32, false},
	{"1M seq read QD8", "read", "1M", 8, true},
	{"1M seq write QD8", "write", "1M", 8, true},
}

// BenchmarkVM boots the VM with 4 emulated NVMe disks once and runs TestPerfInGuest there:
// md raid10 and every frontend, every case, in that one boot. It logs the table (markdown)
// and the top of the CPU profile of the serving process in every case.
// It runs once whatever b.N is (the figures are the table's, not ns/op).
func BenchmarkVM(b *testing.B) {
	vm.HostHalf(b)
	out := b.TempDir()
	files := vm.SparseFiles(b, out, "disk", disks, diskSize)
	var vmDisks []vm.Disk
	for i, p := range files {
		vmDisks = append(vmDisks, vm.Disk{File: p, NVMe: true, Serial: fmt.Sprintf("%s%d", diskSerial, i)})
	}
	env := []string{outEnv + "=" + out}
	for _, k := range []string{runtimeEnv, frontendsEnv} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	vm.RunGoTestOpts(b, vm.Options{
		Timeout:  24 * time.Minute,
		Memory:   2048,
		Env:      env,
		Writable: []string{out},
		Disks:    vmDisks,
		// The ublk rows need ublk_drv, which Debian's 6.1 lacks: the whole table is measured
		// in one boot of the 6.12 kernel (or RAID10_PERF_KERNEL's), so md, NBD and ublk
		// compare within one run.
		KernelSeries: perfKernel(),
		// dm_crypt, xts, algif_skcipher: the nbd+crypt rows (crypt_test.go).
		Modules: append(append([]string{}, vm.DefaultModules...), "nvme", "ublk_drv", "dm_crypt", "xts", "algif_skcipher"),
	}, ".", "-test.run=^TestPerfInGuest$", "-test.v", "-test.timeout=23m")
	for _, f := range files {
		_ = os.Remove(f)
	}
	res, err := os.ReadFile(filepath.Join(out, "result.md"))
	if err != nil {
		b.Fatalf("no result table: %v", err)
	}
	b.Log("\n" + string(res))
	profs, _ := filepath.Glob(filepath.Join(out, "*.cpu"))
	sort.Strings(profs)
	if dst := os.Getenv("RAID10_PERF_TABLE"); dst != "" {
		// The table, and the profiles beside it (<table>.<frontend>_<case>.cpu).
		if err := os.WriteFile(dst, res, 0o644); err != nil {
			b.Fatal(err)
		}
		for _, p := range profs {
			if data, err := os.ReadFile(p); err == nil {
				_ = os.WriteFile(strings.TrimSuffix(dst, ".md")+"."+filepath.Base(p), data, 0o644)
			}
		}
	}
	for _, p := range profs {
		name := strings.TrimSuffix(filepath.Base(p), ".cpu")
		top, err := vm.PprofTop(p)
		if err != nil {
			b.Logf("go tool pprof %s: %v\n%s", name, err, top)
			continue
		}
		b.Logf("CPU profile of the serving process, %s:\n%s", name, top)
	}
}

// sample is what one fio run cost, from counters read before and after it.
type sample struct {
	iops, bw  float64 // I/Os and bytes per second (fio)
	ios       float64 // I/Os completed (fio)
	memberOps float64 // reads and writes completed on the NVMe disks
	cpu       float64 // seconds of utime+stime of this process
	guestCPU  float64 // seconds the guest's CPUs were busy, every process and the kernel (/proc/stat)
	syscalls  float64 // syscr+syscw of this process
	requests  float64 // frontend requests; 0 for md
	pipe      float64 // the pipe copy's bytes per second measured just before (large cases)
	straced   float64 // every system call of this process per request, counted by strace in a run of its own; 0: not counted
	err       string  // why there is no figure
}

type counters struct {
	memberOps float64
	cpu       float64
	guestCPU  float64
	syscalls  float64
	requests  float64
}

func readCounters(t *testing.T, nvme []string, requests func() uint64) counters {
	t.Helper()
	var c counters
	for _, d := range nvme {
		b, err := os.ReadFile(filepath.Join("/sys/block", d, "stat"))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		r, _ := strconv.ParseFloat(f[0], 64)
		w, _ := strconv.ParseFloat(f[4], 64)
		c.memberOps += r + w
	}
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	c.cpu = (ut + st) / 100 // USER_HZ
	c.guestCPU = guestBusy(t)
	io, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(io), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		if k == "syscr" || k == "syscw" {
			n, _ := strconv.ParseFloat(v, 64)
			c.syscalls += n
		}
	}
	if requests != nil {
		c.requests = float64(requests())
	}
	return c
}

// guestBusy is the time, in seconds, the guest's CPUs have been busy since boot: the
// first line of /proc/stat less idle and iowait. It counts what no process's own times
// show: dm-crypt's kcryptd workers, md's threads, interrupts.
func guestBusy(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	busy := 0.0
	for i, v := range f[1:min(len(f), 9)] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / 100 // USER_HZ
}

// perfKernel is the kernel series BenchmarkVM boots (RAID10_PERF_KERNEL).
func perfKernel() string {
	switch k := os.Getenv(kernelEnv); k {
	case "":
		return vm.UblkKernelSeries
	case "newest":
		return vm.NewestKernelSeries
	default:
		return k
	}
}

// selected reports whether the frontend is measured in this run (RAID10_PERF_FRONTENDS).
func selected(name string) bool {
	list := os.Getenv(frontendsEnv)
	return list == "" || slices.Contains(strings.Split(list, ","), name)
}

func runtimeSeconds() string {
	if r := os.Getenv(runtimeEnv); r != "" {
		return r
	}
	return "8"
}

// runFio runs one case on dev and returns its sample; profile, if set, is where the CPU
// profile of this process during the run goes.
func runFio(t *testing.T, dev string, c fioCase, nvme []string, requests func() uint64, profile string) sample {
	t.Helper()
	size := "512M"
	var pipe float64
	if c.large {
		size = "1G"
		// The guest's speed follows the host's load from minute to minute: the ceiling
		// is measured next to the case it bounds.
		pipe = pipeCopy(t)
	}
	if profile != "" {
		defer vm.CPUProfile(t, profile)()
	}
	before := readCounters(t, nvme, requests)
	r := vm.RunFio(t, c.job("perf", dev, size, "--runtime="+runtimeSeconds()))
	after := readCounters(t, nvme, requests)
	s := sample{
		iops:      r.IOPS(),
		bw:        r.BW(),
		ios:       r.IOs(),
		memberOps: after.memberOps - before.memberOps,
		cpu:       after.cpu - before.cpu,
		guestCPU:  after.guestCPU - before.guestCPU,
		syscalls:  after.syscalls - before.syscalls,
		requests:  after.requests - before.requests,
		pipe:      pipe,
	}
	t.Logf("%s on %s: %.0f IOPS, %.1f MB/s, %.2f member ops, %.2f requests, %.0f us CPU and %.1f syscalls per I/O",
		c.name, dev, s.iops, s.bw/1e6, s.memberOps/s.ios, s.requests/s.ios, s.cpu/s.ios*1e6, s.syscalls/s.ios)
	return s
}

// straceCount runs the case again with strace -c attached to every thread of this process
// for the middle of the run, and returns the system calls (all of them: futex, epoll_wait,
// read, pwrite64, ...) per request the frontend served meanwhile. The tracing slows the
// process down, so the run is not timed.
func straceCount(t *testing.T, dev string, c fioCase, requests func() uint64) float64 {
	t.Helper()
	if _, err := exec.LookPath("strace"); err != nil || requests == nil {
		return 0
	}
	fio := exec.Command("fio", c.job("strace", dev, "512M", "--runtime=12").Args()...)
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	defer fio.Wait() //nolint:errcheck // its output is not used
	time.Sleep(2 * time.Second)
	out := filepath.Join(t.TempDir(), "strace.txt")
	st := exec.Command("strace", "-f", "-c", "-o", out, "-p", strconv.Itoa(os.Getpid()))
	if err := st.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // attached to every thread
	r0 := requests()
	time.Sleep(6 * time.Second)
	r1 := requests()
	_ = st.Process.Signal(os.Interrupt)
	_ = st.Wait()
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0.0
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && f[len(f)-1] == "total" {
			calls, _ = strconv.ParseFloat(f[3], 64)
		}
	}
	if r1 == r0 || calls == 0 {
		t.Logf("strace counted %v calls over %d requests:\n%s", calls, r1-r0, b)
		return 0
	}
	per := calls / float64(r1-r0)
	t.Logf("%s: %.1f system calls per request (strace, %d requests):\n%s", c.name, per, r1-r0, b)
	return per
}

// nvmeDisks returns the guest's names of the benchmark's disks (nvme<N>n1), ordered by
// their serial (the order of Options.Disks).
func nvmeDisks(t *testing.T) []string {
	t.Helper()
	ms, _ := filepath.Glob("/sys/block/nvme*n1")
	bySerial := map[string]string{}
	for _, m := range ms {
		s, err := os.ReadFile(filepath.Join(m, "device", "serial"))
		if err != nil {
			continue
		}
		if serial := strings.TrimSpace(string(s)); strings.HasPrefix(serial, diskSerial) {
			bySerial[serial] = filepath.Base(m)
		}
	}
	var out []string
	for i := range disks {
		d, ok := bySerial[fmt.Sprintf("%s%d", diskSerial, i)]
		if !ok {
			t.Fatalf("no NVMe disk with serial %s%d in the guest (found %v)", diskSerial, i, bySerial)
		}
		out = append(out, d)
	}
	return out
}

// pipeCopy is the guest's dd | dd throughput in bytes per second, 1 MiB blocks.
func pipeCopy(t *testing.T) float64 {
	t.Helper()
	const mib = 64
	start := time.Now()
	vm.Sh(t, "sh", "-c", fmt.Sprintf("dd if=/dev/zero bs=1M count=%d status=none | dd of=/dev/null bs=1M iflag=fullblock status=none", mib))
	bw := mib << 20 / time.Since(start).Seconds()
	t.Logf("pipe copy: %.1f MB/s", bw/1e6)
	return bw
}

// TestPerfInGuest is the guest half of BenchmarkVM.
func TestPerfInGuest(t *testing.T) {
	vm.GuestHalf(t, "BenchmarkVM")
	outDir := os.Getenv(outEnv)
	if outDir == "" {
		testenv.Skip(t, testenv.KindDriven, "run by BenchmarkVM")
	}
	nvme := nvmeDisks(t)
	var devs []string
	for _, d := range nvme {
		devs = append(devs, "/dev/"+d)
	}
	results := map[string]map[string]sample{} // target -> case -> sample

	// md raid10, near-2, 512 KiB chunks, no bitmap, over the disks.
	stopMD := vm.CreateMD(t, "/dev/md0", devs, "--layout=n2", "--chunk=512", "--bitmap=none")
	results["md"] = map[string]sample{}
	for _, c := range cases {
		results["md"][c.name] = runFio(t, "/dev/md0", c, nvme, nil, "")
	}
	stopMD()

	for _, f := range frontends {
		if selected(f.name) {
			res, paired := measureFrontend(t, f, devs, nvme, outDir)
			results[f.name] = res
			if f.paired != "" {
				results[f.paired] = paired
			}
		}
	}

	table := renderTable(results)
	t.Log("\n" + table)
	if err := os.WriteFile(filepath.Join(outDir, "result.md"), []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
}

// measureFrontend creates the engine's array over the disks (as md: near-2, 512 KiB
// chunks), attaches it with f and runs every case. A frontend with paired rows has each
// case run first on its plain device (attached.plain), just before its own run: those
// samples are the second result.
func measureFrontend(t *testing.T, f frontend, devs, nvme []string, outDir string) (res, paired map[string]sample) {
	t.Helper()
	res, paired = map[string]sample{}, map[string]sample{}
	arr := vm.CreateArray(t, devs, raid10.CreateOptions{AssumeClean: true, ChunkSize: 512 << 10})
	defer arr.Close()
	att, err := f.attach(t, arr)
	if errors.Is(err, errUnavailable) {
		t.Logf("%s: %v", f.name, err)
		for _, c := range cases {
			res[c.name], paired[c.name] = sample{err: err.Error()}, sample{err: err.Error()}
		}
		return res, paired
	}
	if err != nil {
		t.Fatalf("%s: attach: %v", f.name, err)
	}
	for _, c := range cases {
		if att.plain != "" {
			paired[c.name] = runFio(t, att.plain, c, nvme, att.requests, "")
		}
		prof := filepath.Join(outDir, f.name+" "+c.name+".cpu")
		res[c.name] = runFio(t, att.dev, c, nvme, att.requests, strings.ReplaceAll(prof, " ", "_"))
	}
	for _, c := range cases {
		if c.qd == 32 {
			s := res[c.name]
			s.straced = straceCount(t, att.dev, c, att.requests)
			res[c.name] = s
		}
	}
	if err := att.detach(); err != nil {
		t.Fatalf("%s: detach: %v", f.name, err)
	}
	return res, paired
}

func renderTable(results map[string]map[string]sample) string {
	var b strings.Builder
	rt := runtimeSeconds()
	fmt.Fprintf(&b, "fio libaio direct, %s s per case, in one VM boot (TCG) with 4 emulated NVMe disks; "+
		"md raid10 near-2, 512 KiB chunks, no bitmap; the engine with the same geometry. "+
		"The pipe copy (dd | dd, 1 MiB blocks) is measured just before each 1 MiB case; /pipe copy is the ratio to it.\n\n", rt)
	b.WriteString("| case | target | IOPS | MB/s | /md | /pipe copy | CPU per I/O | guest CPU per I/O | read+write syscalls per I/O | all syscalls per request (strace) | member ops per I/O | requests per I/O |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	targets := []string{"md"}
	for _, f := range frontends {
		if selected(f.name) {
			if f.paired != "" {
				targets = append(targets, f.paired)
			}
			targets = append(targets, f.name)
		}
	}
	for _, c := range cases {
		md := results["md"][c.name]
		for _, tg := range targets {
			s, ok := results[tg][c.name]
			if !ok {
				continue
			}
			if s.err != "" {
				fmt.Fprintf(&b, "| %s | %s | n/a: %s | | | | | | | | | |\n", c.name, tg, s.err)
				continue
			}
			ratio, vsPipe, cpu, sys, req, all := "1.00", "", "", "", "", ""
			if tg != "md" {
				ratio = fmt.Sprintf("%.2f", s.iops/md.iops)
				cpu = fmt.Sprintf("%.0f us", s.cpu/s.ios*1e6)
				sys = fmt.Sprintf("%.1f", s.syscalls/s.ios)
				req = fmt.Sprintf("%.2f", s.requests/s.ios)
				if s.straced > 0 {
					all = fmt.Sprintf("%.1f", s.straced)
				}
			}
			if c.large && s.pipe > 0 {
				vsPipe = fmt.Sprintf("%.2f (pipe %.1f MB/s)", s.bw/s.pipe, s.pipe/1e6)
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f | %s | %s | %s | %.0f us | %s | %s | %.2f | %s |\n",
				c.name, tg, s.iops, s.bw/1e6, ratio, vsPipe, cpu, s.guestCPU/s.ios*1e6, sys, all, s.memberOps/s.ios, req)
		}
	}
	return b.String()
}
