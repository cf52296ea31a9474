package uring

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestYielderPasses checks the Yielder's pace on a test clock: a pass at the first call, then
// one per YieldEvery however often it is asked, whatever the calls' spacing.
func TestYielderPasses(t *testing.T) {
	clock := time.Unix(1000, 0)
	y := Yielder{now: func() time.Time { return clock }}
	if !y.Yield() {
		t.Fatal("first call did not pass through the scheduler")
	}
	passes := 0
	const step = 100 * time.Microsecond
	const span = 100 * time.Millisecond
	for elapsed := time.Duration(0); elapsed < span; elapsed += step {
		clock = clock.Add(step)
		if y.Yield() {
			passes++
		}
	}
	if want := int(span / YieldEvery); passes != want {
		t.Fatalf("%d passes over %v asked every %v, want %d (one per %v)", passes, span, step, want, YieldEvery)
	}
	// A wait longer than the period: the next call passes at once.
	clock = clock.Add(3 * YieldEvery)
	if !y.Yield() {
		t.Fatal("no pass after a wait of three periods")
	}
	if y.Yield() {
		t.Fatal("a second pass at the same instant")
	}
}

// TestYielderLockedThread runs a Yielder on a goroutine locked to its thread, as the ublk
// queue threads do (the kernel takes a queue's commands only from the thread that fetched
// for it): the passes through the scheduler come back to the same thread.
func TestYielderLockedThread(t *testing.T) {
	type result struct {
		before, after, passes int
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		r := result{before: unix.Gettid()}
		var y Yielder
		for deadline := time.Now().Add(10 * time.Second); r.passes < 3 && time.Now().Before(deadline); {
			if y.Yield() {
				r.passes++
			}
		}
		r.after = unix.Gettid()
		done <- r
	}()
	r := <-done
	if r.passes < 3 {
		t.Fatalf("%d passes through the scheduler in 10 s, want 3", r.passes)
	}
	if r.before != r.after {
		t.Fatalf("the locked goroutine moved from thread %d to %d", r.before, r.after)
	}
}
