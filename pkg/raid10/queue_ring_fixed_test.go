package raid10

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// fixedDone is a zero-copy request's Completer: told on the owner, or
// ended through retry (its caller would serve it the copying way).
type fixedDone struct {
	ch      doneCh
	owner   int
	other   int // told off the owner (the copying path's fallbacks)
	retried int
}

func (f *fixedDone) Complete(err error)        { f.other++; f.ch <- err }
func (f *fixedDone) CompleteOnOwner(err error) { f.owner++; f.ch <- err }
func (f *fixedDone) retry()                    { f.retried++; f.ch <- errRetried }

var errRetried = os.ErrDeadlineExceeded // a marker only: what retry sends the waiter

// fixedBufs registers n aligned buffers of size bytes on the driver's ring.
func fixedBufs(t *testing.T, d *ringDriver, n, size int) [][]byte {
	t.Helper()
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = AlignedBuffer(size)
	}
	if err := d.ring.RegisterBuffers(bufs); err != nil {
		t.Fatal(err)
	}
	return bufs
}

// TestRingQueueFixed: reads and writes whose data is a fixed buffer of the
// owner's ring (user memory here; ublk's request pages in the server) go to
// the members with READ_FIXED/WRITE_FIXED and end inside Reap, with the
// data where the model has it; a request the zero-copy path cannot take
// (two chunks) is refused with nothing started; a read on a failing member
// ends through retry, untold; a write there is told by the failure rules.
func TestRingQueueFixed(t *testing.T) {
	ms := fileMembers(t, 4, 16<<20)
	if !ms[0].(*FileMember).Direct() {
		t.Fatal("the test directory does not support O_DIRECT: the ring path would not run")
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, RegionSize: 1 << 20, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	d := newRingDriver(t, a, 16)
	q := d.q
	rng := rand.New(rand.NewPCG(22, 7))
	model := make([]byte, a.Size())
	fillRand(rng, model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	bufs := fixedBufs(t, d, 2, 4*BlockSize)
	refused := uint64(0)
	for i := range 200 {
		n := int64(1+rng.IntN(4)) * BlockSize
		off := rng.Int64N((a.Size()-n)/BlockSize) * BlockSize
		if off%testChunk+n > testChunk {
			off -= off%testChunk + n - testChunk
		}
		k := i % 2
		b := bufs[k][:n]
		f := &fixedDone{ch: make(doneCh, 1)}
		fb := uring.Fixed{Index: uint16(k), Addr: uring.BufAddr(b)}
		if i%3 == 0 {
			fillRand(rng, b)
			copy(model[off:], b)
			if !q.WriteFixed(b, off, fb, f, f.retry) {
				// Its region's bitmap bit is not durable yet: the copying path sets it.
				refused++
				q.Write(b, off, false, f)
			}
		} else if !q.ReadFixed(b, off, fb, f, f.retry) {
			t.Fatalf("read %d of %d at %d refused", i, n, off)
		}
		if err := d.wait(f.ch); err != nil || f.owner+f.other != 1 {
			t.Fatalf("request %d: %v, told on the owner %d times", i, err, f.owner)
		}
		if i%3 != 0 && !bytes.Equal(b, model[off:off+n]) {
			t.Fatalf("read %d of %d at %d: wrong data", i, n, off)
		}
	}
	got := make([]byte, len(model))
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("the array differs from the model after the zero-copy writes (%v)", err)
	}
	fixed, retried := q.FixedStats()
	t.Logf("%d zero-copy requests, %d writes refused (bitmap bit not yet durable)", fixed, refused)
	if fixed != 200-refused || retried != 0 || refused == 67 {
		t.Fatalf("fixed %d, retried %d, refused %d: want every request but the refused writes (some of 67) zero-copy, none retried", fixed, retried, refused)
	}
	f := &fixedDone{ch: make(doneCh, 1)}
	if q.ReadFixed(bufs[0][:2*BlockSize], testChunk-BlockSize, uring.Fixed{Addr: uring.BufAddr(bufs[0])}, f, f.retry) {
		t.Fatal("a read across two chunks took the zero-copy path")
	}

	// Member 0 fails every request: a read of its copy ends through retry,
	// a write is told by the failure rules (member 0 failed, acknowledged).
	// A write first makes region 0's bitmap bit durable, which the zero-copy
	// write needs.
	if _, err := a.WriteAt(model[:BlockSize], 0); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if err := unix.Dup2(int(dir.Fd()), ms[0].(*FileMember).fd); err != nil {
		t.Fatal(err)
	}
	// Chunk 0's reads go to member 0 or 1: member 1 fails its reads too for one read,
	// which so meets a failing member and ends through retry, untold.
	save, err := unix.Dup(ms[1].(*FileMember).fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(save)
	if err := unix.Dup2(int(dir.Fd()), ms[1].(*FileMember).fd); err != nil {
		t.Fatal(err)
	}
	fb := uring.Fixed{Addr: uring.BufAddr(bufs[0])}
	if !q.ReadFixed(bufs[0][:BlockSize], 0, fb, f, f.retry) {
		t.Fatal("read refused")
	}
	if err := d.wait(f.ch); !errors.Is(err, errRetried) || f.retried != 1 || f.owner+f.other != 0 {
		t.Fatalf("read on failing members: %v, retried %d, told %d+%d times: want retry only", err, f.retried, f.owner, f.other)
	}
	if err := unix.Dup2(save, ms[1].(*FileMember).fd); err != nil {
		t.Fatal(err)
	}
	f = &fixedDone{ch: make(doneCh, 1)}
	copy(bufs[0], bytes.Repeat([]byte{0x5a}, BlockSize))
	copy(model, bufs[0][:BlockSize])
	if !q.WriteFixed(bufs[0][:BlockSize], 0, fb, f, f.retry) {
		t.Fatal("write refused")
	}
	if err := d.wait(f.ch); err != nil || f.retried != 0 {
		t.Fatalf("write with a failing copy: %v, retried %d: want acknowledged by the surviving copy", err, f.retried)
	}
	if st := a.Status(); st.Members[0].State != MemberFaulty {
		t.Fatalf("member 0: %+v, want faulty", st.Members[0])
	}
	if _, err := a.ReadAt(got[:BlockSize], 0); err != nil || !bytes.Equal(got[:BlockSize], model[:BlockSize]) {
		t.Fatalf("the surviving copy does not hold the write (%v)", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRingQueueFixedDeadline: under a 300 ms member deadline, a zero-copy
// read stuck on its member is not abandoned (its I/O is on the request's own
// pages): it waits past the deadline for its own completion, which here
// (an eventfd's 8 bytes, a short read) ends it through retry.
func TestRingQueueFixedDeadline(t *testing.T) {
	ms := fileMembers(t, 4, 16<<20)
	opts := testOpts()
	opts.MemberTimeout = 300 * time.Millisecond
	a, err := Create(ms, CreateOptions{Options: opts, ChunkSize: testChunk, RegionSize: 1 << 20, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	d := newRingDriver(t, a, 8)
	bufs := fixedBufs(t, d, 1, BlockSize)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := unix.Dup2(efd, ms[0].(*FileMember).fd); err != nil {
		t.Fatal(err)
	}
	// Chunk 0's copies are on members 0 and 1; the read goes to either: try until one is
	// stuck on member 0.
	for try := 0; ; try++ {
		f := &fixedDone{ch: make(doneCh, 1)}
		if !d.q.ReadFixed(bufs[0], 0, uring.Fixed{Addr: uring.BufAddr(bufs[0])}, f, f.retry) {
			t.Fatal("read refused")
		}
		stuck := time.Now()
		_, _ = d.ring.Submit()
		time.Sleep(50 * time.Millisecond)
		d.reapAll()
		select {
		case err := <-f.ch:
			if err != nil || try == 20 {
				t.Fatalf("try %d: read ended %v without reaching member 0", try, err)
			}
			continue
		default:
		}
		time.Sleep(600 * time.Millisecond) // twice the deadline
		d.reapAll()
		if len(f.ch) != 0 || d.q.zombies.Load() != 0 {
			t.Fatalf("the zero-copy read stuck on member 0 ended (%d) or was abandoned (%d) at the deadline", len(f.ch), d.q.zombies.Load())
		}
		if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		if err := d.wait(f.ch); !errors.Is(err, errRetried) || f.retried != 1 {
			t.Fatalf("the stuck read ended %v (retried %d), want retry", err, f.retried)
		}
		t.Logf("the stuck zero-copy read waited %v for its own completion", time.Since(stuck).Round(time.Millisecond))
		break
	}
	if err := d.q.Close(); err != nil {
		t.Fatal(err)
	}
}
