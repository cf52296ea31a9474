package uring

import (
	"runtime"
	"time"
)

// YieldEvery is how often a goroutine that lives in io_uring_enter passes through the Go
// scheduler (Yielder): half the runtime's 10 ms preemption period.
const YieldEvery = 5 * time.Millisecond

// Yielder keeps a goroutine that spends its life in io_uring_enter, locked to its thread and
// never parked (a ublk queue thread, the engine's reaper), from looking to the Go runtime
// like one that runs without end.
//
// The runtime's monitor (sysmon) counts a goroutine that has not passed through the
// scheduler for 10 ms as running too long, however much of that time it spent in system
// calls: it preempts it, takes its P back while it waits in the kernel, and, having taken
// something, polls again every 20 µs instead of backing off to 10 ms. A thread that serves
// a thousand requests a second then costs the process thousands of monitor wake-ups and P
// hand-offs a second: in the VM benchmark at queue depth 1, two thread switches per request
// on top of the queue thread's own two (docs/performance.md). Passing through the scheduler
// (runtime.Gosched) more often than that keeps the monitor backing off; on a thread locked
// to its goroutine a pass costs a few thread switches, hence at most once per YieldEvery.
//
// A Yielder is owned by its goroutine; the zero value is ready.
type Yielder struct {
	last time.Time
	now  func() time.Time // time.Now; a test's clock
}

// Yield passes through the scheduler if YieldEvery has passed since the last pass (or
// this is the first call), and reports whether it did. Call it before a wait.
func (y *Yielder) Yield() bool {
	now := time.Now
	if y.now != nil {
		now = y.now
	}
	t := now()
	if !y.last.IsZero() && t.Sub(y.last) < YieldEvery {
		return false
	}
	runtime.Gosched()
	y.last = t
	return true
}
