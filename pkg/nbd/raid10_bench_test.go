package nbd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// BenchmarkFioRAID10 serves a RAID10 array over four O_DIRECT member files (on the disk under
// os.TempDir) twice in the same run, to fio's nbd engine over a unix socket: through the
// engine's asynchronous queue (raid10.Queue on io_uring, the default) and through its
// blocking calls (Options.SyncOnly, the path before the queue). 4k randread and randwrite at
// QD1 and QD32, one connection; the two servers take turns NBD_BENCH_ROUNDS times (default 3)
// and the best run of each counts. Each case reports IOPS, this process's CPU time per I/O
// (the server runs in it) and x-sync, the queue's IOPS over the blocking path's.
func BenchmarkFioRAID10(b *testing.B) {
	needBinary(b, "fio")
	const memberSize = 128 << 20
	dir, err := os.MkdirTemp("", "nbd-raid10-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var members []raid10.Member
	for i := range 4 {
		p := filepath.Join(dir, fmt.Sprintf("m%d", i))
		fillFile(b, p, memberSize)
		m, err := raid10.OpenFileMember(p)
		if err != nil {
			b.Fatal(err)
		}
		members = append(members, m)
	}
	arr, err := raid10.Create(members, raid10.CreateOptions{AssumeClean: true})
	if err != nil {
		b.Fatal(err)
	}
	defer arr.Close()
	servers := map[string]string{}
	for _, mode := range []string{"queue", "sync"} {
		_, sock := startServer(b, Options{MinBlockSize: raid10.BlockSize, SyncOnly: mode == "sync"}, Export{Backend: arr})
		servers[mode] = sock
	}
	runtime, rounds := benchRuns(b)
	var table strings.Builder
	fmt.Fprintf(&table, "\n%-22s %10s %10s %8s %14s %14s\n", "4k, fio nbd, 1 conn", "queue", "sync", "x-sync", "queue us CPU/IO", "sync us CPU/IO")
	for _, rw := range []string{"randread", "randwrite"} {
		for _, qd := range []int{1, 32} {
			best := map[string][2]float64{} // iops, CPU us per I/O
			for range rounds {
				for _, mode := range []string{"queue", "sync"} {
					t0 := cpuTicks(b, os.Getpid())
					iops, ios := runFio(b, servers[mode], rw, qd, 1, runtime)
					cpu := float64(cpuTicks(b, os.Getpid())-t0) / clockTicks * 1e6 / ios
					if iops > best[mode][0] {
						best[mode] = [2]float64{iops, cpu}
					}
				}
			}
			name := fmt.Sprintf("%s/qd%d", rw, qd)
			b.Run(name, func(b *testing.B) {
				b.ReportMetric(best["queue"][0], "iops")
				b.ReportMetric(best["sync"][0], "sync-iops")
				b.ReportMetric(ratio(best["queue"][0], best["sync"][0]), "x-sync")
				b.ReportMetric(best["queue"][1], "cpu-us/io")
				b.ReportMetric(best["sync"][1], "sync-cpu-us/io")
			})
			fmt.Fprintf(&table, "%-22s %10.0f %10.0f %8.2f %14.1f %14.1f\n", name, best["queue"][0], best["sync"][0],
				ratio(best["queue"][0], best["sync"][0]), best["queue"][1], best["sync"][1])
		}
	}
	b.Log(table.String())
}
