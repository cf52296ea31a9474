package raid10

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// The fault matrix over the asynchronous request path (see TestFaultMatrix):
// the same rounds, model, walker and faults, on members that are O_DIRECT
// files behind a FaultyMember, so that a share of the foreground reads and
// writes (RAID10_QUEUE_SHARE, default 0.5) goes through a Queue per worker,
// several in flight as NBD submits them. The faults the FaultyMember injects
// into the synchronous calls are mirrored onto the ring (ringFaulty): a
// failing member's ring I/O fails, a hung one's hangs past the deadline and
// is abandoned, and in crash rounds a batch of Queue writes is in flight when
// the members vanish. Every check of the matrix applies to the Queue's
// completions; the verifications after the round and after each restart
// read through a Queue too. The summary counts the requests that took the
// ring, those that fell back to the synchronous path, and the ring copies
// abandoned.

// TestFaultMatrixQueue runs the fault matrix with a share of the foreground
// I/O on Queues: a few fixed seeds in `make test`, random ones under
// RAID10_SOAK (make soak), one with RAID10_SEED.
func TestFaultMatrixQueue(t *testing.T) {
	share := 0.5
	if v := os.Getenv("RAID10_QUEUE_SHARE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f > 1 {
			t.Fatalf("RAID10_QUEUE_SHARE=%q: want a share in (0, 1]", v)
		}
		share = f
	}
	probeQueueDir(t)
	runMatrix(t, 4, 0x51, 22, matrixCfg{queueShare: share})
}

// probeQueueDir skips the test where io_uring is unavailable (fails it under
// CI), and fails it where the test directory cannot hold O_DIRECT files:
// the ring path would never run.
func probeQueueDir(t *testing.T) {
	ms := fileMembers(t, 2, 4<<20)
	if !ms[0].(*FileMember).Direct() {
		t.Fatalf("%s does not support O_DIRECT: the ring path would not run (set TMPDIR to a disk's directory)", os.TempDir())
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	q, err := a.NewQueue(1)
	if errors.Is(err, ErrNoRing) {
		testenv.Missing(t, "no io_uring here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

// matrixCfg is what a fault matrix run varies.
type matrixCfg struct {
	// queueShare is the share of the workers' iterations that submit a
	// batch through their Queue instead of one synchronous call; above 0
	// the members are O_DIRECT files (ringFaulty).
	queueShare float64
	// ring puts each worker's Queue on a ring the worker drives
	// (NewRingQueue, as a ublk queue thread; queue_ring_matrix_test.go).
	ring bool
}

// queueCounts are the Queue requests of a round (atomics: the workers add).
type queueCounts struct {
	fast, fallback, abandoned, crashInflight atomic.Uint64
	// Ring I/O that met an injected fault: sent to a descriptor that fails
	// it, or to one that hangs (ringFaulty).
	failing, hung atomic.Uint64
}

// add counts q's requests, once it is closed.
func (c *queueCounts) add(q *Queue) {
	f, s := q.Stats()
	c.fast.Add(f)
	c.fallback.Add(s)
	c.abandoned.Add(q.abandoned.Load())
}

// ringFaulty is a FaultyMember over an O_DIRECT file whose ring I/O meets
// the faults armed on the FaultyMember, as its synchronous calls do: while a
// countdown is armed (not yet run down) the ring defers to the synchronous
// path, which counts it; once reads or writes fail, or a range fails, the
// ring gets a descriptor of the same file opened for the other direction
// only (EBADF); a member gone gets an O_PATH descriptor (every I/O fails);
// a stalled one a socket whose reads and writes hang until Unstall, which
// then fail. With the volatile cache on, a range the cache holds stays off
// the ring (the ring would bypass the cache); a ring write lands at once,
// as a write the disk wrote back early.
type ringFaulty struct {
	*FaultyMember
	c                  *queueCounts
	file               *FileMember
	rdFd, wrFd, pathFd int
	holds              atomic.Int64 // ring requests between ringTarget and ringDone
	mu                 sync.Mutex
	hangs              map[*chan struct{}]int // a stall's socket end
	fds                []int                  // to close at the end
	released           sync.WaitGroup         // the goroutines that end stalls
}

// newRingFaulty creates an O_DIRECT file of size bytes at path and wraps it.
func newRingFaulty(path string, size int64, c *queueCounts) (*ringFaulty, error) {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Truncate(path, size); err != nil {
		return nil, err
	}
	fm, err := OpenFileMember(path)
	if err != nil {
		return nil, err
	}
	if !fm.Direct() {
		_ = fm.Close()
		return nil, fmt.Errorf("%s: no O_DIRECT", path)
	}
	r := &ringFaulty{FaultyMember: NewFaultyMember(fm), c: c, file: fm, hangs: map[*chan struct{}]int{}}
	for _, o := range []struct {
		fd    *int
		flags int
	}{{&r.rdFd, unix.O_RDONLY | unix.O_DIRECT}, {&r.wrFd, unix.O_WRONLY | unix.O_DIRECT}, {&r.pathFd, unix.O_PATH}} {
		fd, err := unix.Open(path, o.flags|unix.O_CLOEXEC, 0)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		*o.fd = fd
		r.fds = append(r.fds, fd)
	}
	return r, nil
}

// ringTarget implements ringMember (see ringFaulty).
func (r *ringFaulty) ringTarget(off, n int64) (int, int64, bool) {
	f := r.FaultyMember
	if f.readsLeft.Load() > 0 || f.writesLeft.Load() > 0 {
		return 0, 0, false
	}
	readBad, writeBad := f.readsLeft.Load() == 0, f.writesLeft.Load() == 0
	f.mu.Lock()
	for _, b := range f.bad {
		if off < b.off+b.length && b.off < off+n {
			readBad, writeBad = readBad || b.read, writeBad || b.write
		}
	}
	cached := false
	for o := int64(0); f.volatile && o < n && !cached; o += BlockSize {
		_, cached = f.cache[off+o]
	}
	f.mu.Unlock()
	if cached {
		return 0, 0, false
	}
	fd, at, ok := r.file.ringTarget(off, n)
	if !ok {
		return 0, 0, false
	}
	r.holds.Add(1)
	switch ch := f.stall.Load(); {
	case ch != nil:
		fd, at = r.hang(ch), 0 // a socket takes no offset (ESPIPE)
		r.c.hung.Add(1)
		return fd, at, true
	case f.gone.Load() || readBad && writeBad:
		fd = r.pathFd
	case readBad:
		fd = r.wrFd
	case writeBad:
		fd = r.rdFd
	default:
		return fd, at, true
	}
	r.c.failing.Add(1)
	return fd, at, true
}

// ringDone implements ringMember.
func (r *ringFaulty) ringDone() {
	r.holds.Add(-1)
	r.file.ringDone()
}

// hang returns the socket the ring I/O of stall ch goes to: its send buffer
// is full and its peer never reads nor writes, so that reads and writes on
// it wait, until Unstall closes the peer and they fail (end of file, EPIPE).
func (r *ringFaulty) hang(ch *chan struct{}) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fd, ok := r.hangs[ch]; ok {
		return fd
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		panic(fmt.Sprintf("socketpair for a stalled member: %v", err))
	}
	if err := unix.SetNonblock(sp[0], true); err != nil {
		panic(err)
	}
	fill := make([]byte, 64<<10)
	for {
		if _, err := unix.Write(sp[0], fill); err != nil {
			break
		}
	}
	if err := unix.SetNonblock(sp[0], false); err != nil {
		panic(err)
	}
	r.hangs[ch] = sp[0]
	r.fds = append(r.fds, sp[0])
	r.released.Add(1)
	go func() {
		defer r.released.Done()
		<-*ch
		_ = unix.Close(sp[1])
	}()
	return sp[0]
}

// close releases the file and the descriptors, once no ring request holds
// them.
func (r *ringFaulty) close() {
	r.released.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, fd := range r.fds {
		_ = unix.Close(fd)
	}
	r.fds = nil
	_ = r.file.Close()
}

// ringMembers makes the members of queue rounds and waits for their ring
// requests to end.
type ringMembers struct {
	dir  string
	size int64
	c    *queueCounts
	all  []*ringFaulty
}

// member returns a new blank member.
func (m *ringMembers) member(t *testing.T) (*FaultyMember, Member) {
	r, err := newRingFaulty(filepath.Join(m.dir, fmt.Sprintf("m%d", len(m.all))), m.size, m.c)
	if err != nil {
		t.Fatal(err)
	}
	m.all = append(m.all, r)
	return r.FaultyMember, r
}

// quiesce waits until no ring request to any member is left (abandoned
// copies included): a crash or a reassembly must not see one land later.
func (m *ringMembers) quiesce(t *testing.T) {
	deadline := time.Now().Add(20 * time.Second)
	for _, r := range m.all {
		for r.holds.Load() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d ring requests to %s still outstanding after 20s", r.holds.Load(), r.file.Path())
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// close releases every member's file, after quiesce.
func (m *ringMembers) close() {
	for _, r := range m.all {
		r.close()
	}
}

// matrixQueue submits a matrix worker's batches through its Queue.
type matrixQueue struct {
	a     *Array
	model []blockHistory
	// check checks a read of blocks [b, b+l) that returned p and err.
	check func(b, l int64, p []byte, err error) error
}

// queued is one request of a batch.
type queued struct {
	write, fua bool
	b, l       int64
	p          []byte
	done       doneCh
}

// batch submits 1 to 8 requests over blocks [lo, lo+section), none
// overlapping another: reads and writes (one write in six FUA, one
// buffer in eight unaligned: both take the synchronous path), then waits
// for them, checks the reads against the model and records the writes,
// adding the acknowledged blocks to touched (for the worker's flushes).
func (m *matrixQueue) batch(q batchQueue, wrng *rand.Rand, lo, section int64, touched *[]int64) error {
	var reqs []queued
	for range 1 + wrng.IntN(8) {
		b := lo + wrng.Int64N(section)
		l := min(lo+section-b, 1+wrng.Int64N(8))
		overlap := false
		for _, r := range reqs {
			overlap = overlap || b < r.b+r.l && r.b < b+l
		}
		if overlap {
			continue
		}
		r := queued{write: wrng.IntN(2) == 0, b: b, l: l, done: make(doneCh, 1)}
		if wrng.IntN(8) == 0 {
			r.p = make([]byte, l*BlockSize+1)[1:]
		} else {
			r.p = AlignedBuffer(int(l * BlockSize))
		}
		if r.write {
			r.fua = wrng.IntN(6) == 0
			fillRand(wrng, r.p)
			for i := range l {
				m.model[b+i].issue(r.p[i*BlockSize : (i+1)*BlockSize])
			}
			q.Write(r.p, b*BlockSize, r.fua, r.done)
		} else {
			q.Read(r.p, b*BlockSize, r.done)
		}
		reqs = append(reqs, r)
	}
	if err := q.Submit(); err != nil {
		return fmt.Errorf("queue submit: %w", err)
	}
	var first error
	for _, r := range reqs {
		err := q.wait(r.done)
		if !r.write {
			if first == nil {
				first = m.check(r.b, r.l, r.p, err)
			}
			continue
		}
		for i := range r.l {
			if m.model[r.b+i].done(r.p[i*BlockSize:(i+1)*BlockSize], err, r.fua) {
				*touched = append(*touched, r.b+i)
			}
		}
	}
	return first
}

// crashBatch submits writes of random blocks through a new Queue on a and
// returns once they are handed to the kernel, with what waits for them and
// records them in the model (the members may vanish in between: the
// crash). The caller owns every block (the workers have stopped).
func crashBatch(t *testing.T, a *Array, model []blockHistory, rng *rand.Rand, c *queueCounts) (inflight func() int, wait func()) {
	q, err := a.NewQueue(16)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []queued
	blocks := a.Size() / BlockSize
	for range 16 {
		b := rng.Int64N(blocks)
		l := min(blocks-b, 1+rng.Int64N(8))
		overlap := false
		for _, r := range reqs {
			overlap = overlap || b < r.b+r.l && r.b < b+l
		}
		if overlap {
			continue
		}
		r := queued{write: true, b: b, l: l, p: AlignedBuffer(int(l * BlockSize)), done: make(doneCh, 1)}
		fillRand(rng, r.p)
		for i := range l {
			model[b+i].issue(r.p[i*BlockSize : (i+1)*BlockSize])
		}
		q.Write(r.p, b*BlockSize, false, r.done)
		reqs = append(reqs, r)
	}
	if err := q.Submit(); err != nil {
		t.Fatal(err)
	}
	inflight = func() int {
		n := 0
		for _, r := range reqs {
			n += 1 - len(r.done)
		}
		return n
	}
	wait = func() {
		for _, r := range reqs {
			err := <-r.done
			for i := range r.l {
				model[r.b+i].done(r.p[i*BlockSize:(i+1)*BlockSize], err, false)
			}
		}
		if err := q.Close(); err != nil {
			t.Errorf("closing the crash batch's queue: %v", err)
		}
		c.add(q)
	}
	return inflight, wait
}

// readAllBlocks reads every block of b in order and calls fn with each:
// through a Queue (batches of 32 one-block reads) when c is not nil, else
// with ReadAt.
func readAllBlocks(t *testing.T, b *Array, c *queueCounts, fn func(blk int64, p []byte, err error)) {
	blocks := b.Size() / BlockSize
	if c == nil {
		p := make([]byte, BlockSize)
		for blk := range blocks {
			_, err := b.ReadAt(p, blk*BlockSize)
			fn(blk, p, err)
		}
		return
	}
	q, err := b.NewQueue(32)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := q.Close(); err != nil {
			t.Errorf("closing the verification queue: %v", err)
		}
		c.add(q)
	}()
	const batch = 32
	bufs := make([][]byte, batch)
	dones := make([]doneCh, batch)
	for i := range bufs {
		bufs[i], dones[i] = AlignedBuffer(BlockSize), make(doneCh, 1)
	}
	for lo := int64(0); lo < blocks; lo += batch {
		k := min(batch, blocks-lo)
		for i := range k {
			q.Read(bufs[i], (lo+i)*BlockSize, dones[i])
		}
		if err := q.Submit(); err != nil {
			t.Fatal(err)
		}
		for i := range k {
			fn(lo+i, bufs[i], <-dones[i])
		}
	}
}
