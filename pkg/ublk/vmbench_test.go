package ublk

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

const benchEnv = "UBLK_VM_BENCH_OUT"

// BenchmarkUblkVM compares, in one boot of the 6.12 kernel, fio libaio (direct) 4 KiB
// random reads and writes at QD1 and QD32 and 1 MiB sequential reads and writes at QD8 on
// md raid10 over 4 brd ramdisks, on the RAID10 engine over the same ramdisks served over NBD
// (/dev/nbdX, 2 connections, 1 MiB requests) and over ublk (/dev/ublkbN). It logs IOPS or
// MB/s, the ratios ublk/NBD and each/md, the serving process's CPU per I/O, and the top of
// a CPU profile taken during the ublk runs.
func BenchmarkUblkVM(b *testing.B) {
	vm.HostHalf(b)
	out := b.TempDir()
	vm.RunGoTestOpts(b, vm.Options{
		Timeout: 9 * time.Minute, Memory: 3072,
		KernelSeries: vm.UblkKernelSeries, Modules: append(slices.Clone(vm.DefaultModules), "ublk_drv"),
		Env:          []string{benchEnv + "=" + out},
		Writable:     []string{out},
		ModuleParams: map[string]string{"brd": "rd_nr=8 rd_size=98304"},
	}, ".", "-test.run=^TestUblkBenchInGuest$", "-test.v", "-test.timeout=8m")
	if res, err := os.ReadFile(filepath.Join(out, "result.txt")); err == nil {
		b.Log("\n" + string(res))
	}
	if top, err := vm.PprofTop(filepath.Join(out, "ublk.cpu")); err == nil {
		b.Log("CPU profile of the ublk server in the guest, 4k randread QD32:\n" + top)
	}
}

type benchCase struct {
	name, rw string
	bs       string
	qd       int
	big      bool // report MB/s
}

var benchCases = []benchCase{
	{"4k randread QD1", "randread", "4k", 1, false},
	{"4k randread QD32", "randread", "4k", 32, false},
	{"4k randwrite QD1", "randwrite", "4k", 1, false},
	{"4k randwrite QD32", "randwrite", "4k", 32, false},
	{"1M read QD8", "read", "1M", 8, true},
	{"1M write QD8", "write", "1M", 8, true},
}

type benchResult struct {
	value  float64 // IOPS, or MB/s for big cases
	ios    float64
	cpuIO  time.Duration // serving process CPU per I/O (0 for md)
	hasCPU bool
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchFio(t *testing.T, dev string, c benchCase, server bool) benchResult {
	t.Helper()
	c0 := cpuTime()
	r := vm.RunFio(t, vm.FioJob{Name: "b", File: dev, RW: c.rw, BS: c.bs, IODepth: c.qd, Size: "160M",
		Extra: []string{"--time_based", "--runtime=5", "--ramp_time=1"}})
	cpu := cpuTime() - c0
	res := benchResult{value: r.IOPS(), ios: r.IOs()}
	if c.big {
		res.value = r.BW() / 1e6
	}
	if server && res.ios > 0 {
		// CPU over the whole fio run (with its ramp) per I/O counted after the ramp: an
		// upper bound, the same for both frontends.
		res.cpuIO, res.hasCPU = time.Duration(float64(cpu)/res.ios), true
	}
	t.Logf("%s %s: %.0f %s", dev, c.name, res.value, map[bool]string{true: "MB/s", false: "IOPS"}[c.big])
	return res
}

// TestUblkBenchInGuest is the guest half of BenchmarkUblkVM.
func TestUblkBenchInGuest(t *testing.T) {
	inGuest(t)
	outDir := os.Getenv(benchEnv)
	if outDir == "" {
		testenv.Skip(t, testenv.KindDriven, "run by BenchmarkUblkVM")
	}
	// md over ram4-7, the engine over ram0-3 (identical ramdisks), all three set up at once so
	// that each case runs on md, NBD and ublk back to back: the host's load drifts less
	// between the three runs of a case than between whole series.
	rams := []string{"/dev/ram0", "/dev/ram1", "/dev/ram2", "/dev/ram3"}
	mdRams := []string{"/dev/ram4", "/dev/ram5", "/dev/ram6", "/dev/ram7"}
	res := map[string]benchResult{}
	vm.CreateMD(t, "/dev/md0", mdRams, "--bitmap=none")

	arr := vm.CreateArray(t, rams, raid10.CreateOptions{AssumeClean: true})
	defer func() { _ = arr.Close() }()
	srv, err := nbd.NewVolumeServer("bench", arr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	nl, err := kernel.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	st, err := kernel.OpenState(filepath.Join(t.TempDir(), "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	a := kernel.NewAttacher(srv, nl, st, kernel.Options{Connections: 2, MaxRequestKiB: 1024})
	d, err := a.Attach("bench", "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Detach("bench") }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := Create(ctx, arr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = u.Delete(context.Background()) }()
	t.Logf("ublk %s: scheduler %s, max_sectors_kb %s; nbd %s: scheduler %s, max_sectors_kb %s",
		u.Path(), vm.QueueAttr(t, u.Path(), "scheduler"), vm.QueueAttr(t, u.Path(), "max_sectors_kb"),
		d.Path(), vm.QueueAttr(t, d.Path(), "scheduler"), vm.QueueAttr(t, d.Path(), "max_sectors_kb"))

	for _, c := range benchCases {
		res["md/"+c.name] = benchFio(t, "/dev/md0", c, false)
		res["nbd/"+c.name] = benchFio(t, d.Path(), c, true)
		res["ublk/"+c.name] = benchFio(t, u.Path(), c, true)
	}
	// The profile is taken in a run of its own: its signals (SIGPROF on every thread, which
	// also interrupts io_uring_enter) slow the measured server under TCG.
	stopProfile := vm.CPUProfile(t, filepath.Join(outDir, "ublk.cpu"))
	benchFio(t, u.Path(), benchCases[1], true)
	stopProfile()
	s := u.Stats()
	t.Logf("ublk served %d reads (%d bytes, %d per read), %d writes (%d bytes, %d per write)",
		s.Reads, s.BytesRead, s.BytesRead/max(1, s.Reads), s.Writes, s.BytesWritten, s.BytesWritten/max(1, s.Writes))

	var r strings.Builder
	fmt.Fprintf(&r, "fio libaio direct, 5 s per case, 6.12 kernel under TCG, md raid10 (no bitmap) and the engine each over 4 brd ramdisks, cases run back to back on md, NBD, ublk; NBD: 2 connections, 1 MiB requests; ublk: %d queues x %d\n",
		min(MaxQueues, runtime.NumCPU()), DefaultDepth)
	fmt.Fprintf(&r, "| case | md | NBD | ublk | ublk/NBD | NBD/md | ublk/md | CPU per I/O NBD | CPU per I/O ublk |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range benchCases {
		m, n, u := res["md/"+c.name], res["nbd/"+c.name], res["ublk/"+c.name]
		unit := "IOPS"
		if c.big {
			unit = "MB/s"
		}
		fmt.Fprintf(&r, "| %s | %.0f %s | %.0f | %.0f | %.2fx | %.2fx | %.2fx | %s | %s |\n", c.name, m.value, unit, n.value, u.value,
			u.value/n.value, n.value/m.value, u.value/m.value, n.cpuIO.Round(time.Microsecond), u.cpuIO.Round(time.Microsecond))
	}
	t.Log("\n" + r.String())
	if err := os.WriteFile(filepath.Join(outDir, "result.txt"), []byte(r.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
