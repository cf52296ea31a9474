package raid10

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// doneCh is a Completer that sends the outcome on a channel.
type doneCh chan error

func (d doneCh) Complete(err error) { d <- err }

// queueReq is one request of a batch in TestQueueMatchesModel.
type queueReq struct {
	write bool
	off   int64
	p     []byte
	done  doneCh
}

// newQueueArray creates a 4-member array over O_DIRECT files and a Queue of
// depth 32 on it.
func newQueueArray(t *testing.T) (*Array, *Queue, []Member) {
	t.Helper()
	ms := fileMembers(t, 4, 16<<20)
	if !ms[0].(*FileMember).Direct() {
		t.Fatal("the test directory does not support O_DIRECT: the ring path would not run")
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, RegionSize: 1 << 20, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	q, err := a.NewQueue(32)
	if errors.Is(err, ErrNoRing) && os.Getenv("CI") == "" {
		a.Close()
		t.Skipf("no io_uring here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return a, q, ms
}

// batchQueue is what runBatches drives: a Queue and how its submitter
// waits for a request (on the reaper's Completer call, or by reaping its
// own ring: queue_ring_test.go).
type batchQueue interface {
	Read(p []byte, off int64, done Completer)
	Write(p []byte, off int64, fua bool, done Completer)
	Submit() error
	wait(done doneCh) error
}

// reaped is a Queue with a reaper: its submitter just waits.
type reaped struct{ *Queue }

func (reaped) wait(done doneCh) error { return <-done }

// runBatches submits batches of non-overlapping random requests (reads and
// writes of 4 KiB to 192 KiB, some crossing chunks, some from unaligned
// buffers) through q, waits for each batch, checks every read against model
// and applies every write to it. between runs after each batch.
func runBatches(t *testing.T, q batchQueue, model []byte, rng *rand.Rand, batches int, between func(int)) {
	t.Helper()
	size := int64(len(model))
	for b := range batches {
		var reqs []queueReq
		var used [][2]int64
		for range 1 + rng.IntN(24) {
			n := int64(1+rng.IntN(48)) * BlockSize
			if rng.IntN(4) != 0 {
				n = BlockSize
			}
			off := rng.Int64N((size-n)/BlockSize+1) * BlockSize
			overlap := false
			for _, u := range used {
				overlap = overlap || off < u[1] && u[0] < off+n
			}
			if overlap {
				continue
			}
			used = append(used, [2]int64{off, off + n})
			r := queueReq{write: rng.IntN(2) == 0, off: off, done: make(doneCh, 1)}
			if rng.IntN(8) == 0 {
				r.p = make([]byte, n+1)[1:] // unaligned: the synchronous path
			} else {
				r.p = AlignedBuffer(int(n))
			}
			if r.write {
				fillRand(rng, r.p)
				q.Write(r.p, r.off, rng.IntN(16) == 0, r.done)
			} else {
				q.Read(r.p, r.off, r.done)
			}
			reqs = append(reqs, r)
		}
		if err := q.Submit(); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if err := q.wait(r.done); err != nil {
				t.Fatalf("batch %d: %v at %d+%d: %v", b, map[bool]string{true: "write", false: "read"}[r.write], r.off, len(r.p), err)
			}
			if r.write {
				copy(model[r.off:], r.p)
			} else if !bytes.Equal(r.p, model[r.off:r.off+int64(len(r.p))]) {
				t.Fatalf("batch %d: read at %d+%d differs from what was written", b, r.off, len(r.p))
			}
		}
		if between != nil {
			between(b)
		}
	}
}

// TestQueueMatchesModel drives an array through a Queue with random batches
// and checks every read against a model, then with one member's file cut
// short under it (its reads fail on the ring and are served from the other
// copy by the slow path, which rewrites them), then with a member failed in
// the middle of the run. Both paths must have run.
func TestQueueMatchesModel(t *testing.T) {
	a, q, ms := newQueueArray(t)
	defer a.Close()
	rng := rand.New(rand.NewPCG(22, 1))
	model := make([]byte, a.Size())
	fillRand(rng, model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	runBatches(t, reaped{q}, model, rng, 200, nil)
	fast, slow := q.Stats()
	t.Logf("healthy: %d fast, %d fallbacks", fast, slow)
	if fast == 0 || slow == 0 {
		t.Fatalf("fast %d, fallbacks %d: both paths must run", fast, slow)
	}

	// Member 1's descriptor starts to fail every request (a directory is
	// put in its place): reads fail on the ring and are served from the
	// other copy, the first failed write fails the member.
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if err := unix.Dup2(int(dir.Fd()), ms[1].(*FileMember).fd); err != nil {
		t.Fatal(err)
	}
	runBatches(t, reaped{q}, model, rng, 100, nil)
	if st := a.Status(); st.Members[1].ReadErrors+st.Members[1].WriteErrors == 0 || st.Members[1].State != MemberFaulty {
		t.Fatalf("member 1 after its descriptor failed: %+v, want errors counted and faulty", st.Members[1])
	}

	// Member 3 (of the other pair) fails while batches run: writes are
	// acknowledged by its partner, reads served by it.
	runBatches(t, reaped{q}, model, rng, 100, func(b int) {
		if b == 30 {
			if err := a.FailMember(3); err != nil {
				t.Fatal(err)
			}
		}
	})
	if st := a.Status(); st.Members[3].State != MemberFaulty {
		t.Fatalf("member 3: %+v, want faulty", st.Members[3])
	}
	fast2, slow2 := q.Stats()
	t.Logf("total: %d fast, %d fallbacks", fast2, slow2)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(model))
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("the array differs from the model after the run")
	}
}

// TestQueueCloseWaits closes a Queue right after submitting a batch: Close
// returns only after every request completed, and the array closes after.
func TestQueueCloseWaits(t *testing.T) {
	a, q, _ := newQueueArray(t)
	defer a.Close()
	done := make(doneCh, 64)
	for i := range 64 {
		q.Write(AlignedBuffer(BlockSize), int64(i)*BlockSize, false, done)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if len(done) != 64 {
		t.Fatalf("Close returned with %d of 64 requests completed", len(done))
	}
	for range 64 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestQueueDeadlineAbandons puts an eventfd in place of one member's
// descriptor, under a 300 ms member deadline: its ring reads hang (a read
// waits until the eventfd is written) or fail, and the member is failed
// (by the deadline, or by an error first). Either way the stuck reads are
// abandoned and served from the other copy at once, and their late
// completions (once the eventfd is written) release their state.
func TestQueueDeadlineAbandons(t *testing.T) {
	ms := fileMembers(t, 4, 16<<20)
	opts := testOpts()
	opts.MemberTimeout = 300 * time.Millisecond
	a, err := Create(ms, CreateOptions{Options: opts, ChunkSize: testChunk, RegionSize: 1 << 20, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	q, err := a.NewQueue(8)
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, a.Size())
	fillRand(rand.New(rand.NewPCG(3, 3)), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := unix.Dup2(efd, ms[0].(*FileMember).fd); err != nil {
		t.Fatal(err)
	}
	// Reads of chunk 0 go to member 0 or 1; ask for many so that some hang.
	done := make(doneCh, 8)
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = AlignedBuffer(BlockSize)
		q.Read(bufs[i], int64(i)*BlockSize, done)
	}
	if err := q.Submit(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range bufs {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			// Let the stuck reads end, so that the array can close.
			for range 16 {
				_, _ = unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatal("reads stuck on the member were not abandoned")
		}
	}
	t.Logf("8 reads, some stuck on member 0, completed in %v", time.Since(start).Round(time.Millisecond))
	for i, b := range bufs {
		if !bytes.Equal(b, model[i*BlockSize:(i+1)*BlockSize]) {
			t.Fatalf("read %d differs", i)
		}
	}
	if st := a.Status(); st.Members[0].State != MemberFaulty {
		t.Fatalf("member 0: %+v, want faulty", st.Members[0])
	}
	if q.zombies.Load() == 0 {
		t.Fatal("no ring copy was abandoned")
	}
	// The stuck reads complete (short) once the eventfd has a value.
	if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for q.zombies.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d abandoned copies never completed", q.zombies.Load())
		}
		if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}
