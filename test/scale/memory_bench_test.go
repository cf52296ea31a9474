package scale

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// BenchmarkHollowVolumeMemory measures what one volume costs a hollow node's process, which
// holds every hollow agent of the scale benchmark (issue 28: at 100,000 volumes this decides
// whether the benchmark's own process fits the machine): a pool over four sparse MemDisks,
// 200 volumes of 256 MiB created in it; the heap the pool and its arrays hold per volume
// (their bookkeeping), the MemDisks' written pages per volume (labels, superblocks, bitmaps)
// and the goroutines per volume. The reference in the same run is the same pool over
// MemDisks kept in 64 KiB pages (the page size before). Run it with -benchtime=1x: each
// iteration builds both pools.
func BenchmarkHollowVolumeMemory(b *testing.B) {
	const (
		volumes = 200
		size    = 256 << 20
	)
	heap := testenv.HeapAlloc
	type cost struct{ heap, disk, goroutines float64 }
	measure := func(pageSize int64) cost {
		p, disks, err := openMemPool(fmt.Sprintf("mem-%d", pageSize), 4, 64<<30, pageSize)
		if err != nil {
			b.Fatal(err)
		}
		defer func() {
			if err := p.Close(); err != nil {
				b.Error(err)
			}
		}()
		resident := func() (t int64) {
			for _, d := range disks {
				t += d.Resident()
			}
			return t
		}
		h0, d0, g0 := heap(), resident(), runtime.NumGoroutine()
		for i := range volumes {
			if _, err := p.CreateVolume(fmt.Sprintf("pvc-%04d", i), size, pool.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		d1 := resident()
		// The heap holds the disks' pages too: leave them out, they are counted apart.
		return cost{
			heap:       float64(heap()-h0-(d1-d0)) / volumes,
			disk:       float64(d1-d0) / volumes,
			goroutines: float64(runtime.NumGoroutine()-g0) / volumes,
		}
	}
	for range b.N {
		small := measure(DefaultPageSize)
		large := measure(64 << 10)
		b.ReportMetric(small.heap, "heap-B/volume")
		b.ReportMetric(small.disk, "disk-B/volume")
		b.ReportMetric(large.disk, "disk-B/volume-64KiB-pages")
		b.ReportMetric(small.goroutines, "goroutines/volume")
		b.ReportMetric((small.heap+small.disk)/(large.heap+large.disk), "ratio")
		b.Logf("%d volumes: heap %.0f B, disk pages %.0f B (64 KiB pages: %.0f B), %.1f goroutines per volume; in all %.2f of the 64 KiB pages' cost",
			volumes, small.heap, small.disk, large.disk, small.goroutines, (small.heap+small.disk)/(large.heap+large.disk))
	}
}
