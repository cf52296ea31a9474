package ublk

import (
	"context"
	"sync"
	"testing"
	"time"
)

// growStack uses about depth KiB of this goroutine's stack, so that the runtime copies the
// stack elsewhere (it grows by copying) unless it is that large already.
//
//go:noinline
func growStack(depth int) byte {
	var frame [1024]byte
	frame[depth%len(frame)] = byte(depth)
	if depth <= 0 {
		return frame[0]
	}
	return growStack(depth-1) + frame[depth%len(frame)]
}

// TestInGuestControlStack: a control command's answer reaches its caller even when the
// caller's goroutine stack moves while the kernel works on it. ublk_drv runs every control
// command on an io-wq worker, after Submit has returned; the test moves the stack right then
// (controlSubmitted) in thousands of GET_DEV_INFO calls, each on a fresh goroutine whose
// DevInfo lives on its stack, and every answer must be the device's own: our mark, its ID,
// its queues. With the caller's buffer handed to the kernel as it was, most answers were
// zeroes ("not added by raid10-csi"), what a restarted node plugin saw of its own device.
func TestInGuestControlStack(t *testing.T) {
	inGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, d := servedArray(t, ctx, 32<<20, Options{Queues: 2})

	var mu sync.Mutex
	depth := 0
	controlSubmitted = func() {
		mu.Lock()
		depth = depth%480 + 32 // 32 to 511 KiB: larger than the stacks before, most calls
		n := depth
		mu.Unlock()
		growStack(n)
	}
	defer func() { controlSubmitted = nil }()

	const workers, calls = 4, 500
	var wrong, failed sync.Map
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				done := make(chan struct{})
				go func() { // a fresh goroutine: a small stack that the hook must grow
					defer close(done)
					info, err := GetInfo(ctx, d.ID())
					switch {
					case err != nil:
						failed.Store(w*calls+i, err)
					case !info.Ours() || int(info.DevID) != d.ID() || info.NrHwQueues != 2:
						wrong.Store(w*calls+i, info)
					}
				}()
				<-done
			}
		}()
	}
	wg.Wait()
	nWrong, nFailed := 0, 0
	wrong.Range(func(k, v any) bool {
		if nWrong++; nWrong <= 3 {
			t.Errorf("call %v: info %+v, want device %d's own", k, v, d.ID())
		}
		return true
	})
	failed.Range(func(k, v any) bool {
		if nFailed++; nFailed <= 3 {
			t.Errorf("call %v: %v", k, v)
		}
		return true
	})
	if nWrong+nFailed > 0 {
		t.Fatalf("%d of %d GET_DEV_INFO answers wrong, %d failed", nWrong, workers*calls, nFailed)
	}
	t.Logf("%d GET_DEV_INFO calls, each with its stack moved after the submission: every answer the device's own", workers*calls)
}
