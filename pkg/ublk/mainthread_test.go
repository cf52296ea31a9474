package ublk

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary's main goroutine keeps the main thread (locked in init, so main and
// TestMain run there) and runs the functions sent to mainThreadFuncs (TestMain).
func init() { runtime.LockOSThread() }

var mainThreadFuncs = make(chan func())

// onMainThread runs f on the process's main thread and waits for it.
func onMainThread(f func()) {
	done := make(chan struct{})
	mainThreadFuncs <- func() { defer close(done); f() }
	<-done
}

// TestRunOffMainThread: a queue started from the main thread still runs on a thread of its
// own, which ends with it (the kernel recovers a queue only once its old thread is exiting),
// and the main thread stays the main goroutine's. Where the function moved off the main
// thread by unlocking and trying again, a goroutine locked there (here, the main goroutine;
// in a plugin, any goroutine the scheduler ran on the main thread) never got off it.
func TestRunOffMainThread(t *testing.T) {
	pid := unix.Getpid()
	var ran, mainAfter int
	onMainThread(func() {
		if tid := unix.Gettid(); tid != pid {
			t.Errorf("onMainThread ran on thread %d, not the main thread %d", tid, pid)
		}
		runOffMainThread(func() { ran = unix.Gettid() })
		mainAfter = unix.Gettid()
	})
	if ran == 0 || ran == pid {
		t.Fatalf("f ran on thread %d; the main thread is %d", ran, pid)
	}
	if mainAfter != pid {
		t.Errorf("after runOffMainThread the caller is on thread %d, want the main thread %d", mainAfter, pid)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(ran)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d of f still there 5 s after f returned", ran)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// From any other goroutine f runs locked where that goroutine is, off the main thread.
	done := make(chan int)
	go runOffMainThread(func() { done <- unix.Gettid() })
	if tid := <-done; tid == pid {
		t.Fatalf("from a test goroutine f ran on the main thread %d", pid)
	}
}
