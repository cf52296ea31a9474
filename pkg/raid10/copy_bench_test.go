package raid10

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSnapshot measures a snapshot of a 1 GiB array of 4 file members
// on tmpfs (/dev/shm) into another such array, in one run:
//
//	none-iops    4 KiB random writes/s from 16 submitters, no snapshot (the reference)
//	copy-x       the same during the copy window (copy-before-write on), as a ratio to none
//	after-x      the same once the snapshot is ready (hooks gone), as a ratio to none
//	copy-xb      during the copy as a ratio to the mean of none and after (the
//	             two bracket it in time: drift of the host's load cancels better)
//	cut-pause-us how long NewCopy held the source's writes (drain + hook install)
//	cut-maxwait-us the longest single write around the cut (what a writer saw)
//	ready-s      time to ready for 1 GiB, copier unthrottled, writers running
//	ready-idle-s the same with no foreground writes
//
// Figures are logged, never asserted. Run with
// `go test ./pkg/raid10 -run '^$' -bench Snapshot -benchtime 1x`.
func BenchmarkSnapshot(b *testing.B) {
	const size = 1 << 30
	for range b.N {
		dir, err := os.MkdirTemp("/dev/shm", "raid10-snapbench-")
		if err != nil {
			b.Skip(err)
		}
		mk := func(name string) *Array {
			var ms []Member
			for i := range 4 {
				p := filepath.Join(dir, fmt.Sprintf("%s%d", name, i))
				if err := os.WriteFile(p, nil, 0o600); err != nil {
					b.Fatal(err)
				}
				if err := os.Truncate(p, (size+CopyRecordSize)/2+4<<20); err != nil {
					b.Fatal(err)
				}
				m, err := OpenFileMember(p)
				if err != nil {
					b.Fatal(err)
				}
				ms = append(ms, m)
			}
			opts := Options{SyncRateMin: 1 << 40, SyncRateMax: -1, MemberTimeout: -1}
			a, err := Create(ms, CreateOptions{Options: opts, Size: size + CopyRecordSize, AssumeClean: true})
			if err != nil {
				b.Fatal(err)
			}
			return a
		}
		src, tgt := mk("s"), mk("t")
		if err := src.Reserve(CopyRecordSize); err != nil {
			b.Fatal(err)
		}
		if err := tgt.Reserve(CopyRecordSize); err != nil {
			b.Fatal(err)
		}
		// 16 submitters of 4 KiB random writes; maxWait is the longest write
		// since the last reset.
		var ops atomic.Int64
		var maxWait atomic.Int64
		var stop atomic.Bool
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 3))
				p := AlignedBuffer(BlockSize)
				for !stop.Load() {
					t0 := time.Now()
					if _, err := src.WriteAt(p, rng.Int64N(size/BlockSize)*BlockSize); err != nil {
						b.Error(err)
						return
					}
					d := int64(time.Since(t0))
					for {
						m := maxWait.Load()
						if d <= m || maxWait.CompareAndSwap(m, d) {
							break
						}
					}
					ops.Add(1)
				}
			}()
		}
		iops := func(d time.Duration) float64 {
			n0, t0 := ops.Load(), time.Now()
			time.Sleep(d)
			return float64(ops.Load()-n0) / time.Since(t0).Seconds()
		}
		none := iops(time.Second)
		time.Sleep(50 * time.Millisecond)
		maxWait.Store(0)
		before := time.Now()
		c, err := NewCopy(CopyConfig{Source: src, Target: tgt, Size: size, Live: true})
		if err != nil {
			b.Fatal(err)
		}
		cutCall := time.Since(before)
		time.Sleep(20 * time.Millisecond)
		cutMax := time.Duration(maxWait.Load())
		start := time.Now()
		c.Start()
		during := iops(time.Second)
		ctx := context.Background()
		if err := c.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		ready := time.Since(start)
		after := iops(time.Second)
		stop.Store(true)
		wg.Wait()

		// Time to ready with no foreground I/O: a second snapshot.
		if err := tgt.WriteZeroes(0, size); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		c2, err := NewCopy(CopyConfig{Source: src, Target: tgt, Size: size, Live: true})
		if err != nil {
			b.Fatal(err)
		}
		c2.Start()
		if err := c2.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		idle := time.Since(start)
		b.ReportMetric(none, "none-iops")
		b.ReportMetric(during/none, "copy-x")
		b.ReportMetric(after/none, "after-x")
		b.ReportMetric(during/((none+after)/2), "copy-xb")
		b.ReportMetric(float64(c.Pause.Microseconds()), "cut-pause-us")
		b.ReportMetric(float64(cutMax.Microseconds()), "cut-maxwait-us")
		b.ReportMetric(ready.Seconds(), "ready-s")
		b.ReportMetric(idle.Seconds(), "ready-idle-s")
		b.Logf("1 GiB snapshot on tmpfs: writes %.0f/s without, %.0f/s during the copy (x%.2f), %.0f/s after ready (x%.2f); cut: writes held %v (NewCopy %v), longest write around the cut %v; ready in %v under writes, %v idle (unthrottled)",
			none, during, during/none, after, after/none, c.Pause, cutCall, cutMax, ready.Round(time.Millisecond), idle.Round(time.Millisecond))
		_ = src.Close()
		_ = tgt.Close()
		_ = os.RemoveAll(dir)
	}
}
