package uring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// waitOne submits what is prepared and returns the next completion, failing the test on a
// ring error.
func waitOne(t *testing.T, r *Ring) CQE {
	t.Helper()
	c, err := r.WaitCQE()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFixedBuffers registers two user buffers and moves a file's data through them with
// WRITE_FIXED and READ_FIXED, at an offset inside a buffer (the address names where the I/O
// starts in it); an index past the table, and I/O past a buffer's end, are refused per I/O.
func TestFixedBuffers(t *testing.T) {
	r := newRing(t, 4, 0)
	f, err := os.Create(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	fd := int(f.Fd())
	src := bytes.Repeat([]byte("fixed-buffer-src"), 8192/16)
	dst := make([]byte, 8192)
	if err := r.RegisterBuffers([][]byte{src, dst}); err != nil {
		t.Fatal(err)
	}
	// The second half of buffer 0 to file offset 4096.
	sqe, _ := r.GetSQE()
	sqe.PrepWriteFixed(fd, BufAddr(src[4096:]), 4096, 4096, 0)
	if c := waitOne(t, r); c.Res != 4096 {
		t.Fatalf("write fixed: res %d (%v), want 4096", c.Res, c.Err())
	}
	// Back into the first half of buffer 1.
	sqe, _ = r.GetSQE()
	sqe.PrepReadFixed(fd, BufAddr(dst), 4096, 4096, 1)
	if c := waitOne(t, r); c.Res != 4096 {
		t.Fatalf("read fixed: res %d (%v), want 4096", c.Res, c.Err())
	}
	if !bytes.Equal(dst[:4096], src[4096:]) {
		t.Fatal("read back through fixed buffer 1 differs from what buffer 0 wrote")
	}
	sqe, _ = r.GetSQE()
	sqe.PrepReadFixed(fd, BufAddr(dst), 4096, 0, 2)
	if c := waitOne(t, r); !errors.Is(c.Err(), unix.EFAULT) && !errors.Is(c.Err(), unix.EINVAL) {
		t.Fatalf("read into fixed buffer 2 of 2: res %d, want EFAULT or EINVAL", c.Res)
	}
	sqe, _ = r.GetSQE()
	sqe.PrepReadFixed(fd, BufAddr(dst[4096:]), 8192, 0, 1)
	if c := waitOne(t, r); !errors.Is(c.Err(), unix.EFAULT) {
		t.Fatalf("read of 8 KiB at the middle of an 8 KiB fixed buffer: res %d, want EFAULT", c.Res)
	}
	if err := r.RegisterBuffers([][]byte{src}); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("a second table: %v, want EBUSY", err)
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterBuffers(); !errors.Is(err, unix.ENXIO) {
		t.Fatalf("unregister with no table: %v, want ENXIO", err)
	}
}

// TestSparseBuffers registers a sparse table (what ublk's automatic buffer registration
// needs on the queue's ring): its slots are empty, so a fixed read on one is refused, and the
// table is the ring's one (a second is EBUSY) until unregistered.
func TestSparseBuffers(t *testing.T) {
	r := newRing(t, 4, SetupSQE128)
	if err := r.RegisterSparseBuffers(64); err != nil {
		if errors.Is(err, unix.EINVAL) {
			testenv.Missing(t, "kernel without sparse buffer tables (5.19+): %v", err)
		}
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sqe, _ := r.GetSQE()
	sqe.PrepReadFixed(int(f.Fd()), 0, 4096, 0, 5)
	sqe.UserData = 5
	if c := waitOne(t, r); c.UserData != 5 || !errors.Is(c.Err(), unix.EFAULT) {
		t.Fatalf("read into empty slot 5: %+v, want EFAULT", c)
	}
	if err := r.RegisterSparseBuffers(4); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("a second table: %v, want EBUSY", err)
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4096)
	if err := r.RegisterBuffers([][]byte{b}); err != nil {
		t.Fatalf("a table after the sparse one was removed: %v", err)
	}
	if err := r.RegisterSparseBuffers(0); err == nil {
		t.Fatal("a sparse table of no slots was accepted")
	}
}
