package perf

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
	casesEnv   = "RAID10_PERF_CASES"  // the cases measured: comma-separated substrings of their names (default all)
	roundsEnv  = "RAID10_PERF_ROUNDS" // runs of each case on md and on each frontend (default 1)
	jobsEnv    = "RAID10_PERF_JOBS"   // fio jobs per case, each at the case's depth (default 1)
	diskSize   = 2 << 30              // md on the first half, the engine on the second (splitDisks)
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
	base := []string{"--time_based", "--randrepeat=0"}
	if n := os.Getenv(jobsEnv); n != "" {
		// Several submitters (on several CPUs, and so several of a ublk device's queues),
		// reported as one.
		base = append(base, "--numjobs="+n, "--group_reporting")
	}
	return vm.FioJob{Name: name, File: dev, Size: size, BS: c.bs, RW: c.rw, IODepth: c.qd,
		Extra: append(base, extra...)}
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
	for _, k := range []string{runtimeEnv, frontendsEnv, casesEnv, roundsEnv, jobsEnv, switchesEnv} {
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
	ctxt      float64 // context switches of the whole guest (/proc/stat ctxt)
	syscalls  float64 // syscr+syscw of this process
	requests  float64 // frontend requests; 0 for md
	pipe      float64 // the pipe copy's bytes per second measured just before (large cases)
	ratio     float64 // iops over md's in the run just before; 0 for md
	straced   float64 // every system call of this process per request, counted by strace in a run of its own; 0: not counted
	err       string  // why there is no figure
}

type counters struct {
	memberOps float64
	cpu       float64
	guestCPU  float64
	ctxt      float64
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
	c.guestCPU, c.ctxt = guestBusy(t)
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
// show: dm-crypt's kcryptd workers, md's threads, interrupts. ctxt is the guest's
// context switches since boot (the ctxt line): every thread put to sleep and woken on
// the way of a request, in fio, the kernel and the server alike.
func guestBusy(t *testing.T) (busy, ctxt float64) {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	f := strings.Fields(lines[0]) // cpu user nice system idle iowait irq softirq steal ...
	for i, v := range f[1:min(len(f), 9)] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "ctxt "); ok {
			ctxt, _ = strconv.ParseFloat(v, 64)
		}
	}
	return busy / 100, ctxt // USER_HZ
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

// measured reports whether case c is measured in this run (RAID10_PERF_CASES).
func measured(c fioCase) bool {
	list := os.Getenv(casesEnv)
	if list == "" {
		return true
	}
	for _, sub := range strings.Split(list, ",") {
		if strings.Contains(c.name, sub) {
			return true
		}
	}
	return false
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
	switches := switchView()
	r := vm.RunFio(t, c.job("perf", dev, size, "--runtime="+runtimeSeconds()))
	after := readCounters(t, nvme, requests)
	s := sample{
		iops:      r.IOPS(),
		bw:        r.BW(),
		ios:       r.IOs(),
		memberOps: after.memberOps - before.memberOps,
		cpu:       after.cpu - before.cpu,
		guestCPU:  after.guestCPU - before.guestCPU,
		ctxt:      after.ctxt - before.ctxt,
		syscalls:  after.syscalls - before.syscalls,
		requests:  after.requests - before.requests,
		pipe:      pipe,
	}
	t.Logf("%s on %s: %.0f IOPS, %.1f MB/s, %.2f member ops, %.2f requests, %.0f us CPU, %.1f syscalls and %.1f guest context switches per I/O\n%s",
		c.name, dev, s.iops, s.bw/1e6, s.memberOps/s.ios, s.requests/s.ios, s.cpu/s.ios*1e6, s.syscalls/s.ios, s.ctxt/s.ios, switches(s.ios))
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
	t.Logf("GOMAXPROCS %d, %d CPUs", runtime.GOMAXPROCS(0), runtime.NumCPU())
	mdHalves, engineHalves := splitDisks(t, nvme)

	// md raid10, near-2, 512 KiB chunks, no bitmap, over the first half of every disk,
	// assembled for the whole run: each frontend's case runs right after md's run of it.
	vm.CreateMD(t, "/dev/md0", mdHalves, "--layout=n2", "--chunk=512", "--bitmap=none")
	md := func(c fioCase) sample { return runFio(t, "/dev/md0", c, nvme, nil, "") }

	results := map[string]map[string]sample{"md": {}} // target -> case -> sample
	var mdRuns = map[string][]sample{}
	for _, f := range frontends {
		if selected(f.name) {
			res, paired := measureFrontend(t, f, engineHalves, nvme, outDir, md, mdRuns)
			results[f.name] = res
			if f.paired != "" {
				results[f.paired] = paired
			}
		}
	}
	for name, runs := range mdRuns {
		results["md"][name] = medianBy(runs, func(s sample) float64 { return s.iops })
	}

	table := renderTable(results)
	t.Log("\n" + table)
	if err := os.WriteFile(filepath.Join(outDir, "result.md"), []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
}

// splitDisks maps each disk's two halves as device-mapper linear targets: md runs on the
// first halves and the engine on the second, so that both stay assembled and a case runs on
// md and on a frontend back to back (the host's load drifts from minute to minute, and a
// ratio of two runs minutes apart carries that drift). Both halves pass the same linear
// mapping.
func splitDisks(t *testing.T, nvme []string) (first, second []string) {
	t.Helper()
	for i, d := range nvme {
		b, err := os.ReadFile(filepath.Join("/sys/block", d, "size"))
		if err != nil {
			t.Fatal(err)
		}
		sectors, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		half := sectors / 2 &^ 2047 // whole MiBs
		for k, name := range []string{fmt.Sprintf("perf-md%d", i), fmt.Sprintf("perf-engine%d", i)} {
			table := fmt.Sprintf("0 %d linear /dev/%s %d", half, d, int64(k)*half)
			vm.Sh(t, "dmsetup", "create", name, "--table", table)
			vm.Sh(t, "dmsetup", "mknodes", name) // no udev in the guest
			t.Cleanup(func() { _ = exec.Command("dmsetup", "remove", name).Run() })
			if k == 0 {
				first = append(first, "/dev/mapper/"+name)
			} else {
				second = append(second, "/dev/mapper/"+name)
			}
		}
	}
	return first, second
}

// rounds is how many times each case runs on md and on each frontend
// (RAID10_PERF_ROUNDS, default 1); the table shows the round of median ratio.
func rounds() int {
	if n, err := strconv.Atoi(os.Getenv(roundsEnv)); err == nil && n > 0 {
		return n
	}
	return 1
}

// medianBy returns the sample of median key (the lower one of an even count).
func medianBy(s []sample, key func(sample) float64) sample {
	s = slices.Clone(s)
	sort.Slice(s, func(i, j int) bool { return key(s[i]) < key(s[j]) })
	return s[(len(s)-1)/2]
}

// measureFrontend creates the engine's array over the disks' second halves (as md: near-2,
// 512 KiB chunks), attaches it with f and runs every case, each right after md's run of it
// (mdRun, whose samples are added to mdRuns), rounds() times; each case's sample is the round
// of median ratio to md, with that ratio. A frontend with paired rows has each case run
// first on its plain device (attached.plain), just before its own run: those samples are the
// second result.
func measureFrontend(t *testing.T, f frontend, devs, nvme []string, outDir string, mdRun func(fioCase) sample, mdRuns map[string][]sample) (res, paired map[string]sample) {
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
	if os.Getenv(switchesEnv) != "" {
		// An attached device with no I/O: what its serving threads cost while it waits.
		const idle = 5 * time.Second
		switches := switchView()
		time.Sleep(idle)
		t.Logf("%s attached, idle for %v: per second, %s", f.name, idle, switches(idle.Seconds()))
	}
	runs, pairedRuns := map[string][]sample{}, map[string][]sample{}
	for round := range rounds() {
		for _, c := range cases {
			if !measured(c) {
				continue
			}
			m := mdRun(c)
			mdRuns[c.name] = append(mdRuns[c.name], m)
			if att.plain != "" {
				p := runFio(t, att.plain, c, nvme, att.requests, "")
				p.ratio = p.iops / m.iops
				pairedRuns[c.name] = append(pairedRuns[c.name], p)
			}
			prof := ""
			if round == rounds()-1 {
				prof = strings.ReplaceAll(filepath.Join(outDir, f.name+" "+c.name+".cpu"), " ", "_")
			}
			s := runFio(t, att.dev, c, nvme, att.requests, prof)
			s.ratio = s.iops / m.iops
			t.Logf("%s, round %d: %s / md = %.2f", c.name, round+1, f.name, s.ratio)
			runs[c.name] = append(runs[c.name], s)
		}
	}
	byRatio := func(s sample) float64 { return s.ratio }
	for name, r := range runs {
		res[name] = medianBy(r, byRatio)
	}
	for name, r := range pairedRuns {
		paired[name] = medianBy(r, byRatio)
	}
	for _, c := range cases {
		if c.qd == 32 && measured(c) {
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
		"md raid10 near-2, 512 KiB chunks, no bitmap, on the first half of each disk; the engine with the same geometry on the second half. "+
		"Each frontend's run of a case follows md's run of it; /md is that pair's ratio, the round of median ratio of %d (md's row: its median run). "+
		"The pipe copy (dd | dd, 1 MiB blocks) is measured just before each 1 MiB case; /pipe copy is the ratio to it.\n\n", rt, rounds())
	b.WriteString("| case | target | IOPS | MB/s | /md | /pipe copy | CPU per I/O | guest CPU per I/O | read+write syscalls per I/O | all syscalls per request (strace) | guest context switches per I/O | member ops per I/O | requests per I/O |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
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
		for _, tg := range targets {
			s, ok := results[tg][c.name]
			if !ok {
				continue
			}
			if s.err != "" {
				fmt.Fprintf(&b, "| %s | %s | n/a: %s | | | | | | | | | | |\n", c.name, tg, s.err)
				continue
			}
			ratio, vsPipe, cpu, sys, req, all := "1.00", "", "", "", "", ""
			if tg != "md" {
				ratio = fmt.Sprintf("%.2f", s.ratio)
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
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f | %s | %s | %s | %.0f us | %s | %s | %.1f | %.2f | %s |\n",
				c.name, tg, s.iops, s.bw/1e6, ratio, vsPipe, cpu, s.guestCPU/s.ios*1e6, sys, all, s.ctxt/s.ios, s.memberOps/s.ios, req)
		}
	}
	return b.String()
}
