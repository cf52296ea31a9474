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

// TestQueueSubmitterWaits: lone requests through ReadAt and WriteAt on an
// idle ring are waited for by the submitter itself (selfWaits counts them,
// the reaper stays parked), with the data of the model; while the reaper
// has requests in flight they take the reaper's way and still match; and
// with one member's reads hanging under a 300 ms deadline, a ReadAt the
// submitter waits for is abandoned and served from the other copy, and the
// late completion reaches the reaper.
func TestQueueSubmitterWaits(t *testing.T) {
	ms := fileMembers(t, 4, 16<<20)
	opts := testOpts()
	opts.MemberTimeout = 300 * time.Millisecond
	a, err := Create(ms, CreateOptions{Options: opts, ChunkSize: testChunk, RegionSize: 1 << 20, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	q, err := a.NewQueue(8)
	if errors.Is(err, ErrNoRing) && os.Getenv("CI") == "" {
		t.Skipf("no io_uring here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !q.ring.CanWaitTimeout() {
		t.Skip("kernel without IORING_FEAT_EXT_ARG: the submitter never waits on the ring")
	}
	rng := rand.New(rand.NewPCG(5, 5))
	model := make([]byte, a.Size())
	fillRand(rng, model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	p := AlignedBuffer(BlockSize)
	for i := range 200 {
		off := rng.Int64N(a.Size()/BlockSize) * BlockSize
		if i%2 == 0 {
			fillRand(rng, p)
			if _, err := q.WriteAt(p, off); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], p)
		} else if _, err := q.ReadAt(p, off); err != nil || !bytes.Equal(p, model[off:off+BlockSize]) {
			t.Fatalf("read %d at %d: %v, equal %v", i, off, err, bytes.Equal(p, model[off:off+BlockSize]))
		}
	}
	fast, _ := q.Stats()
	t.Logf("200 lone requests: %d fast, %d waited for on the ring by the submitter", fast, q.selfWaits.Load())
	if q.selfWaits.Load() < 150 || fast < 100 { // a region's first write falls back (its bitmap bit)
		t.Fatalf("%d of 200 lone requests waited for by the submitter, %d fast: want most", q.selfWaits.Load(), fast)
	}

	// With requests in flight on the reaper, ReadAt goes the reaper's way.
	done := make(doneCh, 4)
	for i := range 4 {
		q.Read(AlignedBuffer(BlockSize), int64(i)*testChunk, done)
	}
	if err := q.Submit(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ReadAt(p, 5*BlockSize); err != nil || !bytes.Equal(p, model[5*BlockSize:6*BlockSize]) {
		t.Fatalf("read beside others: %v", err)
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	// Member 0's reads hang: a ReadAt of chunk 0 that goes there is
	// abandoned at the deadline and served by member 1.
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := unix.Dup2(efd, ms[0].(*FileMember).fd); err != nil {
		t.Fatal(err)
	}
	a.slots[1].headPos.Store(a.Size()) // the balancer then picks member 0 first
	start := time.Now()
	for i := range int64(8) {
		if _, err := q.ReadAt(p, i*BlockSize); err != nil || !bytes.Equal(p, model[i*BlockSize:(i+1)*BlockSize]) {
			t.Fatalf("read %d with member 0 hanging: %v", i, err)
		}
	}
	t.Logf("8 reads with member 0 hanging: %v, %d copies abandoned", time.Since(start).Round(time.Millisecond), q.abandoned.Load())
	if q.abandoned.Load() == 0 {
		t.Fatal("no read waited for by the submitter was abandoned")
	}
	for deadline := time.Now().Add(10 * time.Second); q.zombies.Load() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d abandoned copies never completed", q.zombies.Load())
		}
		if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}
