package raid10

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The benchmarks compare 4 KiB random I/O on an array of 4 file members
// with pread/pwrite on one of those files, at 1, 4, 16 and 64 concurrent
// submitters, on tmpfs (/dev/shm) and on the disk under os.TempDir, both
// opened with OpenFileMember (O_DIRECT where the kernel allows it; Linux
// 6.6+ allows it on tmpfs). Each raid10 result reports:
//
//	x-ref    throughput relative to the reference run just before it
//	mutex-%  share of the submitters' time spent blocked on a mutex
//	         (runtime/metrics /sync/mutex/wait/total, runtime locks included)
//
// and -benchmem gives allocs/op. Run with `go test -run '^$' -bench . -benchmem`.

const benchMemberSize = 64 << 20

var refNs sync.Map // "media/op/qd" -> ns per op of the reference

type benchEnv struct {
	files []*FileMember
	arr   *Array
}

var (
	envMu sync.Mutex
	envs  = map[string]*benchEnv{}
)

// benchSetup creates (once per medium) 4 member files filled with random
// data and an array over them.
func benchSetup(b *testing.B, media string) *benchEnv {
	envMu.Lock()
	defer envMu.Unlock()
	if e := envs[media]; e != nil {
		return e
	}
	root := os.TempDir()
	if media == "tmpfs" {
		root = "/dev/shm"
	}
	dir, err := os.MkdirTemp(root, "raid10-bench-")
	if err != nil {
		b.Skip(err)
	}
	buf := make([]byte, 4<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	e := &benchEnv{}
	for i := 0; i < 4; i++ {
		p := filepath.Join(dir, fmt.Sprintf("m%d", i))
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		for off := 0; off < benchMemberSize; off += len(buf) {
			fillRand(rng, buf)
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		m, err := OpenFileMember(p)
		if err != nil {
			b.Fatal(err)
		}
		e.files = append(e.files, m)
	}
	ms := make([]Member, 4)
	for i := range ms {
		// Extents, so Close of the array leaves the files for the reference.
		ms[i], _ = NewExtentMember(e.files[i], 0, e.files[i].Size())
	}
	e.arr, err = Create(ms, CreateOptions{AssumeClean: true})
	if err != nil {
		b.Fatal(err)
	}
	envs[media] = e
	return e
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, e := range envs {
		_ = e.arr.Close()
		for _, f := range e.files {
			_ = f.Close()
			_ = os.RemoveAll(filepath.Dir(f.Path()))
		}
	}
	os.Exit(code)
}

var mutexWait = []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}

func readMutexWait() float64 {
	metrics.Read(mutexWait)
	if mutexWait[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return mutexWait[0].Value.Float64()
}

// runQD runs b.N ops of fn from qd goroutines and returns the wall time.
func runQD(b *testing.B, qd int, size int64, fn func(p []byte, off int64) error) (time.Duration, float64) {
	var next atomic.Int64
	var wg sync.WaitGroup
	bufs := make([][]byte, qd)
	for i := range bufs {
		bufs[i] = AlignedBuffer(BlockSize)
		fillRand(rand.New(rand.NewPCG(uint64(i), 9)), bufs[i])
	}
	blocks := size / BlockSize
	runtime.GC()
	b.ReportAllocs()
	b.SetBytes(BlockSize)
	w0 := readMutexWait()
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < qd; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(b.N)))
			p := bufs[g]
			for next.Add(1) <= int64(b.N) {
				if err := fn(p, rng.Int64N(blocks)*BlockSize); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	return el, (readMutexWait() - w0) / (el.Seconds() * float64(qd))
}

func benchIO(b *testing.B, write bool) {
	for _, media := range []string{"tmpfs", "disk"} {
		b.Run(media, func(b *testing.B) {
			e := benchSetup(b, media)
			for _, qd := range []int{1, 4, 16, 64} {
				key := fmt.Sprintf("%s/%v/%d", media, write, qd)
				b.Run(fmt.Sprintf("qd%d/ref", qd), func(b *testing.B) {
					f := e.files[0]
					op := func(p []byte, off int64) error {
						var err error
						if write {
							_, err = f.WriteAt(p, off)
						} else {
							_, err = f.ReadAt(p, off)
						}
						return err
					}
					el, mw := runQD(b, qd, f.Size(), op)
					refNs.Store(key, float64(el.Nanoseconds())/float64(b.N))
					b.ReportMetric(mw*100, "mutex-%")
				})
				// "raid10-nodeadline" is the same array with the member
				// deadline off: member calls are all made inline (see
				// deadline.go), so the hand-off's cost shows as the ratio of
				// the two x-ref figures.
				for _, v := range []struct {
					name     string
					deadline bool
				}{{"raid10", true}, {"raid10-nodeadline", false}} {
					b.Run(fmt.Sprintf("qd%d/%s", qd, v.name), func(b *testing.B) {
						a := e.arr
						if !v.deadline {
							old := a.mtimeout.Swap(-1)
							defer a.mtimeout.Store(old)
						}
						op := func(p []byte, off int64) error {
							var err error
							if write {
								_, err = a.WriteAt(p, off)
							} else {
								_, err = a.ReadAt(p, off)
							}
							return err
						}
						el, mw := runQD(b, qd, a.Size(), op)
						if ref, ok := refNs.Load(key); ok {
							b.ReportMetric(ref.(float64)/(float64(el.Nanoseconds())/float64(b.N)), "x-ref")
						}
						b.ReportMetric(mw*100, "mutex-%")
					})
				}
			}
		})
	}
}

func BenchmarkRandRead4K(b *testing.B)  { benchIO(b, false) }
func BenchmarkRandWrite4K(b *testing.B) { benchIO(b, true) }
