package uring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// newRing sets up a ring on the running kernel, or ends the test through testenv.Missing
// when the kernel refuses io_uring (built without it, or kernel.io_uring_disabled=2).
func newRing(t *testing.T, entries uint32, flags SetupFlags) *Ring {
	t.Helper()
	r, err := New(entries, flags)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		testenv.Missing(t, "io_uring refused by this kernel (CONFIG_IO_URING, /proc/sys/kernel/io_uring_disabled): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

func TestLayout(t *testing.T) {
	if s := unsafe.Sizeof(SQE{}); s != 64 {
		t.Errorf("SQE is %d bytes, want 64", s)
	}
	if s := unsafe.Sizeof(CQE{}); s != 16 {
		t.Errorf("CQE is %d bytes, want 16", s)
	}
	if s := unsafe.Sizeof(params{}); s != 120 {
		t.Errorf("io_uring_params is %d bytes, want 120", s)
	}
	for _, c := range []struct {
		name string
		off  uintptr
		want uintptr
	}{
		{"fd", unsafe.Offsetof(SQE{}.Fd), 4},
		{"off", unsafe.Offsetof(SQE{}.Off), 8},
		{"addr", unsafe.Offsetof(SQE{}.Addr), 16},
		{"len", unsafe.Offsetof(SQE{}.Len), 24},
		{"user_data", unsafe.Offsetof(SQE{}.UserData), 32},
		{"buf_index", unsafe.Offsetof(SQE{}.BufIndex), 40},
		{"addr3", unsafe.Offsetof(SQE{}.Addr3), CmdOffset},
		{"sq_off", unsafe.Offsetof(params{}.sqOff), 40},
		{"cq_off", unsafe.Offsetof(params{}.cqOff), 80},
	} {
		if c.off != c.want {
			t.Errorf("%s at %d, want %d", c.name, c.off, c.want)
		}
	}
}

// TestNopWraps pushes many rounds of NOPs through a small ring, so both rings wrap many
// times, and checks every completion comes back once with its user data.
func TestNopWraps(t *testing.T) {
	for _, flags := range []SetupFlags{0, SetupSQE128} {
		r := newRing(t, 8, flags)
		if r.Entries() != 8 || r.CQEntries() != 16 {
			t.Fatalf("entries %d/%d, want 8/16", r.Entries(), r.CQEntries())
		}
		next := uint64(0)
		for round := 0; round < 100; round++ {
			want := map[uint64]bool{}
			for i := 0; i < 8; i++ {
				sqe, err := r.GetSQE()
				if err != nil {
					t.Fatalf("round %d sqe %d: %v", round, i, err)
				}
				sqe.PrepNop()
				sqe.UserData = next
				want[next] = true
				next++
			}
			if _, err := r.GetSQE(); !errors.Is(err, ErrSQFull) {
				t.Fatalf("9th SQE of 8: %v, want ErrSQFull", err)
			}
			if r.Pending() != 8 {
				t.Fatalf("pending %d, want 8", r.Pending())
			}
			n, err := r.SubmitAndWait(8)
			if err != nil || n != 8 {
				t.Fatalf("submit: %d, %v", n, err)
			}
			for len(want) > 0 {
				c, ok := r.PeekCQE()
				if !ok {
					t.Fatalf("round %d: %d completions missing", round, len(want))
				}
				r.SeenCQE()
				if !want[c.UserData] || c.Res != 0 {
					t.Fatalf("round %d: unexpected completion %+v", round, c)
				}
				delete(want, c.UserData)
			}
			if c, ok := r.PeekCQE(); ok {
				t.Fatalf("extra completion %+v", c)
			}
		}
	}
}

// TestReadWrite writes and reads a real file through the ring, 128-byte SQEs.
func TestReadWrite(t *testing.T) {
	r := newRing(t, 4, SetupSQE128)
	f, err := os.Create(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	blocks := [][]byte{bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096), bytes.Repeat([]byte{3}, 512)}
	for i, b := range blocks {
		sqe, err := r.GetSQE()
		if err != nil {
			t.Fatal(err)
		}
		sqe.PrepWrite(int(f.Fd()), b, uint64(i*4096))
		sqe.UserData = uint64(i)
	}
	if _, err := r.Submit(); err != nil {
		t.Fatal(err)
	}
	for range blocks {
		c, err := r.WaitCQE()
		if err != nil {
			t.Fatal(err)
		}
		if c.Err() != nil || int(c.Res) != len(blocks[c.UserData]) {
			t.Fatalf("write %d: res %d (%v)", c.UserData, c.Res, c.Err())
		}
	}
	got := make([]byte, 3*4096)
	sqe, _ := r.GetSQE()
	sqe.PrepRead(int(f.Fd()), got, 0)
	c, err := r.WaitCQE()
	if err != nil {
		t.Fatal(err)
	}
	if c.Res != 2*4096+512 {
		t.Fatalf("read returned %d, want %d (short at end of file)", c.Res, 2*4096+512)
	}
	if !bytes.Equal(got[:c.Res], bytes.Join(blocks, nil)) {
		t.Fatal("read back differs from what was written")
	}
	// A read on a closed descriptor completes with EBADF, not a failed submit.
	sqe, _ = r.GetSQE()
	sqe.PrepRead(-1, got, 0)
	if c, err = r.WaitCQE(); err != nil || !errors.Is(c.Err(), unix.EBADF) {
		t.Fatalf("read from fd -1: %+v %v, want EBADF", c, err)
	}
}

// TestURingCmd sends a URING_CMD with a full 80-byte command area to a file whose driver has
// no uring_cmd handler: the kernel decodes the 128-byte SQE and answers EOPNOTSUPP. The
// command area of one SQE must not spill into the next one.
func TestURingCmd(t *testing.T) {
	r := newRing(t, 4, SetupSQE128)
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	a, _ := r.GetSQE()
	a.PrepURingCmd(int(f.Fd()), 0xc0207504)
	a.UserData = 1
	cmd := r.Cmd(a)
	if len(cmd) != 80 {
		t.Fatalf("command area %d bytes, want 80", len(cmd))
	}
	for i := range cmd {
		cmd[i] = 0xff
	}
	b, _ := r.GetSQE()
	if uintptr(unsafe.Pointer(b))-uintptr(unsafe.Pointer(a)) != 128 {
		t.Fatalf("SQEs %d bytes apart, want 128", uintptr(unsafe.Pointer(b))-uintptr(unsafe.Pointer(a)))
	}
	if b.Opcode != 0 || b.UserData != 0 {
		t.Fatalf("next SQE not zeroed: %+v", *b)
	}
	b.PrepNop()
	b.UserData = 2
	if _, err := r.SubmitAndWait(2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		c, err := r.WaitCQE()
		if err != nil {
			t.Fatal(err)
		}
		switch c.UserData {
		case 1:
			if !errors.Is(c.Err(), unix.EOPNOTSUPP) {
				t.Errorf("URING_CMD on a regular file: res %d (%v), want EOPNOTSUPP", c.Res, c.Err())
			}
		case 2:
			if c.Res != 0 {
				t.Errorf("NOP: res %d", c.Res)
			}
		default:
			t.Errorf("unexpected completion %+v", c)
		}
	}
	if len(newRing(t, 4, 0).Cmd(a)) != 16 {
		t.Error("a 64-byte SQE's command area is not 16 bytes")
	}
}

func TestBadSetup(t *testing.T) {
	newRing(t, 1, 0) // io_uring present, else ended here
	if _, err := New(0, 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("New(0): %v, want EINVAL", err)
	}
	r := newRing(t, 2, 0)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.GetSQE(); !errors.Is(err, ErrClosed) {
		t.Errorf("GetSQE after Close: %v, want ErrClosed", err)
	}
	if _, err := r.Submit(); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Close: %v, want ErrClosed", err)
	}
}

// TestTimeout waits on a ring for a timeout of 20 ms: it completes with ETIME, not before.
func TestTimeout(t *testing.T) {
	r := newRing(t, 4, 0)
	sqe, err := r.GetSQE()
	if err != nil {
		t.Fatal(err)
	}
	ts := Timespec{Nsec: 20e6}
	sqe.PrepTimeout(&ts)
	sqe.UserData = 9
	start := time.Now()
	c, err := r.WaitCQE()
	if err != nil {
		t.Fatal(err)
	}
	if c.UserData != 9 || !errors.Is(c.Err(), unix.ETIME) {
		t.Fatalf("completion %+v (%v), want user data 9 and ETIME", c, c.Err())
	}
	if d := time.Since(start); d < 15*time.Millisecond {
		t.Fatalf("timeout of 20 ms completed after %v", d)
	}
}

// TestWaitTimeout: a wait for a completion that never comes ends after its timeout; one
// whose completion is there returns at once.
func TestWaitTimeout(t *testing.T) {
	r := newRing(t, 4, 0)
	if !r.CanWaitTimeout() {
		t.Skip("kernel without IORING_FEAT_EXT_ARG")
	}
	ts := Timespec{Nsec: 20e6}
	start := time.Now()
	if err := r.SubmitAndWaitTimeout(1, &ts); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.PeekCQE(); ok {
		t.Fatal("a completion in an empty ring")
	}
	if d := time.Since(start); d < 15*time.Millisecond {
		t.Fatalf("timed out after %v, want 20 ms", d)
	}
	sqe, err := r.GetSQE()
	if err != nil {
		t.Fatal(err)
	}
	sqe.PrepNop()
	sqe.UserData = 5
	if err := r.SubmitAndWaitTimeout(1, &ts); err != nil {
		t.Fatal(err)
	}
	if c, ok := r.PeekCQE(); !ok || c.UserData != 5 {
		t.Fatalf("completion %+v %v, want the NOP's", c, ok)
	}
}
