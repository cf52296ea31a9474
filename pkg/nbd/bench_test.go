package nbd

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gonbdbackend "github.com/pojntfx/go-nbd/pkg/backend"
	gonbdserver "github.com/pojntfx/go-nbd/pkg/server"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// BenchmarkFioNBD measures this server against nbdkit (C, file plugin) and go-nbd's server
// (v0.3.2), all serving the same file (on /dev/shm when present) to fio's nbd engine over a
// unix socket, in the same run: 4k randread and randwrite at QD1 and QD32 with 1 and 4
// connections. The servers take turns, NBD_BENCH_ROUNDS times per case (default 3), and the
// best run of each counts: on a shared machine the load changes from one run to the next,
// and the best of interleaved runs is the least disturbed. Each case reports IOPS and the
// server's CPU time per I/O (its process's user+system time over the run, divided by the
// I/Os); the parent logs a table with the ratios. NBD_BENCH_RUNTIME sets the seconds per fio
// run (default 3).
//
// A file in memory makes every request cost CPU only: on a machine with few cores, where fio
// and the server share them, the IOPS follow the CPU per I/O and a server gains nothing from
// serving requests in parallel. BenchmarkFioNBDDevice measures that.
func BenchmarkFioNBD(b *testing.B) {
	benchFio(b, 0, []int{1, 32})
}

// BenchmarkFioNBDDevice is BenchmarkFioNBD over a device that takes 1 ms per read or write
// (the file behind a delay: time.Sleep for this server and go-nbd's, nbdkit's delay filter),
// at QD32: what a server that serves requests in parallel gains over one that serves them
// one at a time per connection (go-nbd) on a device with latency, the case of a real disk.
func BenchmarkFioNBDDevice(b *testing.B) {
	benchFio(b, time.Millisecond, []int{32})
}

func benchFio(b *testing.B, delay time.Duration, depths []int) {
	needBinary(b, "fio")
	needBinary(b, "nbdkit")
	runtime, rounds := benchRuns(b)
	const size = 256 << 20
	dir := b.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "nbdbench")
		if err == nil {
			dir = d
			defer os.RemoveAll(d)
		}
	}
	img := filepath.Join(dir, "bench.img")
	fillFile(b, img, size)

	sockDir, err := os.MkdirTemp("", "nbdbench")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(sockDir)

	// This server.
	fb, err := OpenFileBackend(img, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer fb.Close()
	var backend blockdev.Backend = fb
	if delay > 0 {
		backend = delayBackend{fb, delay}
	}
	srv, err := NewServer(Options{}, Export{Backend: backend})
	if err != nil {
		b.Fatal(err)
	}
	ours := filepath.Join(sockDir, "ours.sock")
	ln, err := Listen(ours)
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()

	// go-nbd's server, in this process as well.
	gf, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer gf.Close()
	var gb gonbdbackend.Backend = gonbdbackend.NewFileBackend(gf)
	if delay > 0 {
		gb = delayGoNBD{gb, delay}
	}
	gonbd := filepath.Join(sockDir, "gonbd.sock")
	gln, err := net.Listen("unix", gonbd)
	if err != nil {
		b.Fatal(err)
	}
	defer gln.Close()
	gexports := []*gonbdserver.Export{{Name: "", Backend: gb}}
	go func() {
		for {
			c, err := gln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = gonbdserver.Handle(c, gexports, &gonbdserver.Options{
					MinimumBlockSize: 1, PreferredBlockSize: 4096, MaximumBlockSize: 32 << 20,
					SupportsMultiConn: true,
				})
			}()
		}
	}()

	// nbdkit, the C reference.
	kit := filepath.Join(sockDir, "nbdkit.sock")
	args := []string{"--foreground", "--exit-with-parent", "--unix", kit}
	if delay > 0 {
		ms := fmt.Sprintf("%dms", delay.Milliseconds())
		args = append(args, "--filter=delay", "file", img, "rdelay="+ms, "wdelay="+ms)
	} else {
		args = append(args, "file", img)
	}
	kitCmd := exec.Command("nbdkit", args...)
	kitCmd.Stderr = os.Stderr
	if err := kitCmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { kitCmd.Process.Kill(); kitCmd.Wait() }()
	waitSocket(b, kit)

	self := os.Getpid()
	servers := []struct {
		name, sock string
		pid        int // whose CPU time is the server's
	}{{"raid10-csi", ours, self}, {"nbdkit", kit, kitCmd.Process.Pid}, {"go-nbd", gonbd, self}}
	type key struct{ cas, server string }
	iops := map[key]float64{}
	cpu := map[key]float64{} // server CPU microseconds per request, of the best run
	var cases []string
	for _, rw := range []string{"randread", "randwrite"} {
		for _, qd := range depths {
			for _, conns := range []int{1, 4} {
				cas := fmt.Sprintf("%s/qd%d/conns%d", rw, qd, conns)
				cases = append(cases, cas)
				b.Run(cas, func(b *testing.B) {
					for range rounds {
						for _, s := range servers {
							t0 := cpuTicks(b, s.pid)
							v, ios := runFio(b, s.sock, rw, qd, conns, runtime)
							used := float64(cpuTicks(b, s.pid)-t0) / clockTicks * 1e6
							if k := (key{cas, s.name}); v > iops[k] {
								iops[k] = v
								cpu[k] = ratio(used, ios)
							}
						}
					}
					for _, s := range servers {
						b.ReportMetric(iops[key{cas, s.name}], s.name+"-iops")
						b.ReportMetric(cpu[key{cas, s.name}], s.name+"-cpu-us/io")
					}
					b.ReportMetric(ratio(iops[key{cas, "raid10-csi"}], iops[key{cas, "nbdkit"}]), "x-nbdkit")
					b.ReportMetric(ratio(iops[key{cas, "raid10-csi"}], iops[key{cas, "go-nbd"}]), "x-go-nbd")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\nbest of %d interleaved runs of %ss each", rounds, runtime)
	if delay > 0 {
		fmt.Fprintf(&t, ", every read and write delayed %v", delay)
	}
	fmt.Fprintf(&t, "\n%-24s %12s %12s %12s %10s %10s   %s\n", "4k, fio nbd engine, IOPS", "raid10-csi", "nbdkit", "go-nbd", "/nbdkit", "/go-nbd",
		"server CPU us/io: raid10-csi nbdkit go-nbd")
	for _, c := range cases {
		o, k, g := iops[key{c, "raid10-csi"}], iops[key{c, "nbdkit"}], iops[key{c, "go-nbd"}]
		fmt.Fprintf(&t, "%-24s %12.0f %12.0f %12.0f %9.2fx %9.2fx   %6.1f %6.1f %6.1f\n", c, o, k, g, ratio(o, k), ratio(o, g),
			cpu[key{c, "raid10-csi"}], cpu[key{c, "nbdkit"}], cpu[key{c, "go-nbd"}])
	}
	b.Log(t.String())
}

// benchRuns returns the seconds per fio run (NBD_BENCH_RUNTIME, default 3) and the rounds
// each case takes (NBD_BENCH_ROUNDS, default 3).
func benchRuns(b *testing.B) (runtime string, rounds int) {
	runtime, rounds = "3", 3
	if r := os.Getenv("NBD_BENCH_RUNTIME"); r != "" {
		runtime = r
	}
	if r := os.Getenv("NBD_BENCH_ROUNDS"); r != "" {
		if _, err := fmt.Sscan(r, &rounds); err != nil || rounds < 1 {
			b.Fatalf("NBD_BENCH_ROUNDS=%q", r)
		}
	}
	return runtime, rounds
}

// delayBackend is a Backend whose reads and writes take d longer: a device with latency.
type delayBackend struct {
	blockdev.Backend
	d time.Duration
}

func (x delayBackend) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(x.d)
	return x.Backend.ReadAt(p, off)
}

func (x delayBackend) WriteAt(p []byte, off int64) (int, error) {
	time.Sleep(x.d)
	return x.Backend.WriteAt(p, off)
}

// delayGoNBD is delayBackend for go-nbd's server.
type delayGoNBD struct {
	gonbdbackend.Backend
	d time.Duration
}

func (x delayGoNBD) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(x.d)
	return x.Backend.ReadAt(p, off)
}

func (x delayGoNBD) WriteAt(p []byte, off int64) (int, error) {
	time.Sleep(x.d)
	return x.Backend.WriteAt(p, off)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func fillFile(b *testing.B, path string, size int) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	rand.Read(chunk)
	for off := 0; off < size; off += len(chunk) {
		chunk[0]++
		if _, err := f.WriteAt(chunk, int64(off)); err != nil {
			b.Fatal(err)
		}
	}
}

func waitSocket(b *testing.B, path string) {
	for i := 0; i < 100; i++ {
		if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			time.Sleep(100 * time.Millisecond) // bound, then listening
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("%s never accepted", path)
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (100 on Linux).
const clockTicks = 100

// cpuTicks returns the user+system CPU time of process pid (all its threads) in clock ticks.
func cpuTicks(b *testing.B, pid int) uint64 {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) may hold spaces: count fields after its closing paren.
	s := string(st)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	var utime, stime uint64
	if _, err := fmt.Sscan(f[11], &utime); err != nil { // field 14
		b.Fatal(err)
	}
	if _, err := fmt.Sscan(f[12], &stime); err != nil { // field 15
		b.Fatal(err)
	}
	return utime + stime
}

// runFio runs one fio job against the NBD server on sock and returns its IOPS and the number of
// I/Os it completed. There is no ramp time: the server's CPU time over the whole run divides by
// every I/O of the run.
func runFio(b *testing.B, sock, rw string, qd, conns int, runtime string) (iops, ios float64) {
	out, err := exec.Command("fio", "--name=bench", "--ioengine=nbd", "--uri="+uri(sock),
		"--rw="+rw, "--bs=4k", fmt.Sprintf("--iodepth=%d", qd), fmt.Sprintf("--numjobs=%d", conns),
		"--size=256M", "--time_based", "--runtime="+runtime,
		"--group_reporting", "--output-format=json").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			b.Fatalf("fio: %v\n%s\n%s", err, out, ee.Stderr)
		}
		b.Fatal(err)
	}
	var r struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				IOPS     float64 `json:"iops"`
				TotalIOs float64 `json:"total_ios"`
			} `json:"read"`
			Write struct {
				IOPS     float64 `json:"iops"`
				TotalIOs float64 `json:"total_ios"`
			} `json:"write"`
		} `json:"jobs"`
	}
	// fio may print notices before the JSON document.
	js := string(out)
	if i := strings.Index(js, "{"); i > 0 {
		js = js[i:]
	}
	if err := json.Unmarshal([]byte(js), &r); err != nil || len(r.Jobs) == 0 {
		b.Fatalf("fio output: %v\n%s", err, out)
	}
	if r.Jobs[0].Error != 0 {
		b.Fatalf("fio error %d", r.Jobs[0].Error)
	}
	j := r.Jobs[0]
	return j.Read.IOPS + j.Write.IOPS, j.Read.TotalIOs + j.Write.TotalIOs
}
