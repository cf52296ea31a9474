package raid10

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkQueue compares random reads and writes (4 KiB at depths 1 and
// 32, 1 MiB at depth 8) through a Queue
// (one submitting goroutine, the given depth in flight, io_uring members)
// with fio's io_uring engine on the same four member files at the same
// depth (direct I/O, one job), run just before in the same process:
//
//	x-fio       our requests per second / fio's (a write is two member
//	            writes for us, one for fio: 0.5 is parity per member I/O)
//	fallback-%  requests that took the synchronous path (a region's first
//	            write persists its bitmap bit there)
//
// qd1 issues each request with Read or Write and waits for its Completer
// (the reaper's way); qd1wait calls ReadAt or WriteAt, where the submitter
// waits on the ring itself (queue_wait.go).
//
// Run with `go test -run '^$' -bench Queue -benchmem ./pkg/raid10`.
func BenchmarkQueue(b *testing.B) {
	cases := []struct {
		bs int
		qd []int
	}{{BlockSize, []int{1, 0, 32}}, {1 << 20, []int{8}}} // 0: qd1wait
	for _, media := range []string{"disk", "tmpfs"} {
		for _, write := range []bool{false, true} {
			for _, c := range cases {
				for _, qd := range c.qd {
					depth := fmt.Sprintf("qd%d", qd)
					if qd == 0 {
						depth = "qd1wait"
					}
					name := fmt.Sprintf("%s/%s/%dk/%s", media, map[bool]string{false: "randread", true: "randwrite"}[write], c.bs>>10, depth)
					b.Run(name, func(b *testing.B) {
						e := benchSetup(b, media)
						ref := fioIOPS(b, e, write, c.bs, max(qd, 1))
						var ours float64
						if qd == 0 {
							ours = queueWaitIOPS(b, e.arr, write, c.bs)
						} else {
							ours = queueIOPS(b, e.arr, write, c.bs, qd)
						}
						b.ReportMetric(ours, "iops")
						b.ReportMetric(ref, "fio-iops")
						b.ReportMetric(ours/ref, "x-fio")
					})
				}
			}
		}
	}
}

var fioRef sync.Map // name -> fio IOPS

// fioIOPS runs fio (io_uring, direct, 4 KiB random, one job at depth qd)
// over the member files for 3 s and returns its IOPS, once per case.
func fioIOPS(b *testing.B, e *benchEnv, write bool, bs, qd int) float64 {
	key := fmt.Sprintf("%s/%v/%d/%d", filepath.Dir(e.files[0].Path()), write, bs, qd)
	if v, ok := fioRef.Load(key); ok {
		return v.(float64)
	}
	var names []string
	for _, f := range e.files {
		names = append(names, strings.ReplaceAll(f.Path(), ":", `\:`))
	}
	rw := "randread"
	if write {
		rw = "randwrite"
	}
	out, err := exec.Command("fio", "--name=ref", "--ioengine=io_uring", "--direct=1", "--rw="+rw, fmt.Sprintf("--bs=%d", bs),
		fmt.Sprintf("--iodepth=%d", qd), "--numjobs=1", "--time_based", "--runtime=3", "--filename="+strings.Join(names, ":"),
		"--output-format=json").Output()
	if err != nil {
		b.Skipf("fio: %v", err)
	}
	var res struct {
		Jobs []struct {
			Read, Write struct {
				IOPS float64 `json:"iops"`
			}
		}
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		b.Fatalf("fio output: %v", err)
	}
	iops := res.Jobs[0].Read.IOPS
	if write {
		iops = res.Jobs[0].Write.IOPS
	}
	fioRef.Store(key, iops)
	return iops
}

// benchOp is one request of queueIOPS; its completion hands it back.
type benchOp struct {
	p    []byte
	err  error
	back chan *benchOp
}

func (o *benchOp) Complete(err error) { o.err = err; o.back <- o }

// queueIOPS runs b.N random 4 KiB requests through a Queue of depth qd from
// one goroutine that keeps qd in flight, and returns requests per second.
func queueIOPS(b *testing.B, a *Array, write bool, bs, qd int) float64 {
	q, err := a.NewQueue(qd)
	if err != nil {
		b.Skip(err)
	}
	back := make(chan *benchOp, qd)
	ops := make([]benchOp, qd)
	rng := rand.New(rand.NewPCG(7, uint64(qd)))
	blocks := a.Size() / int64(bs)
	issue := func(o *benchOp) {
		if write {
			q.Write(o.p, rng.Int64N(blocks)*int64(bs), false, o)
		} else {
			q.Read(o.p, rng.Int64N(blocks)*int64(bs), o)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	issued := 0
	for i := range ops {
		ops[i] = benchOp{p: AlignedBuffer(bs), back: back}
		if issued < b.N {
			issue(&ops[i])
			issued++
		}
	}
	for done := 0; done < b.N; {
		if err := q.Submit(); err != nil {
			b.Fatal(err)
		}
		o := <-back
		for {
			if o.err != nil {
				b.Fatal(o.err)
			}
			done++
			if issued < b.N {
				issue(o)
				issued++
			}
			select {
			case o = <-back:
				continue
			default:
			}
			break
		}
	}
	d := time.Since(start)
	b.StopTimer()
	fast, slow := q.Stats()
	if err := q.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(100*float64(slow)/float64(fast+slow), "fallback-%")
	return float64(b.N) / d.Seconds()
}

// queueWaitIOPS runs b.N random requests one at a time through a Queue's
// ReadAt or WriteAt and returns requests per second.
func queueWaitIOPS(b *testing.B, a *Array, write bool, bs int) float64 {
	q, err := a.NewQueue(1)
	if err != nil {
		b.Skip(err)
	}
	p := AlignedBuffer(bs)
	rng := rand.New(rand.NewPCG(7, 1))
	blocks := a.Size() / int64(bs)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		off := rng.Int64N(blocks) * int64(bs)
		if write {
			_, err = q.WriteAt(p, off)
		} else {
			_, err = q.ReadAt(p, off)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	d := time.Since(start)
	b.StopTimer()
	fast, slow := q.Stats()
	if err := q.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(100*float64(slow)/float64(fast+slow), "fallback-%")
	b.ReportMetric(100*float64(q.selfWaits.Load())/float64(b.N), "self-%")
	return float64(b.N) / d.Seconds()
}
