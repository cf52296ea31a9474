package raid10

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// The asynchronous request path: a Queue submits the member I/O of array
// requests to one io_uring and completes the requests from the ring's
// completions, with no blocking system call and no goroutine per request.
//
// A Queue has two owners. The submitting goroutine (an NBD connection's
// reader, a ublk queue) calls Read, Write and Submit; it alone touches the
// submission ring, so submission takes no lock. The reaper goroutine, started
// by NewQueue, waits for completions and finishes requests; it alone touches
// the completion ring. A request's state (qop) passes from the submitter to
// the reaper through the ring and comes back through the free list.
//
// The fast path serves a request that lies in one chunk, on members that
// have a descriptor (FileMember, ExtentMember over one) opened O_DIRECT, with
// a BlockSize-aligned buffer, when no barrier is raised on its bucket, no
// copy hook covers it, the copy read (or written) holds no bad block there,
// the member deadline does not hand the member's calls to workers (see
// rescue), and, for a write, the region's bitmap bit is already durable and
// FUA is not asked. Anything else runs on the synchronous path (ReadAt,
// WriteAt, WriteAtFUA) in a goroutine of its own and completes the same way:
// rare cases pay a goroutine, the common one none. A member error on the fast
// path goes to the synchronous slow path too (readSlow for a read, the
// failure and acknowledgement rules of finishWrite for a write).

// Completer receives the outcome of a request submitted to a Queue (the
// frontends' contract, blockdev.Completer): once per request, from the
// reaper or from a fallback goroutine, never from inside Read or Write.
type Completer = blockdev.Completer

var (
	_ blockdev.AsyncQueue   = (*Queue)(nil)
	_ blockdev.AsyncBackend = (*Array)(nil)
)

// NewAsyncQueue implements blockdev.AsyncBackend with NewQueue.
func (a *Array) NewAsyncQueue(depth int, idle func()) (blockdev.AsyncQueue, error) {
	q, err := a.newQueue(depth, idle)
	if err != nil {
		return nil, err
	}
	return q, nil
}

// ringMember is a member whose I/O can go to an io_uring: ringTarget
// returns the descriptor and byte offset of [off, off+n) and whether ring
// I/O may be used for it (O_DIRECT, in range).
type ringMember interface {
	// ringTarget holds the descriptor until ringDone when ok.
	ringTarget(off, n int64) (fd int, at int64, ok bool)
	ringDone()
}

// Queue is an asynchronous submission queue of an Array; see above.
type Queue struct {
	a       *Array
	ring    *uring.Ring
	ops     []qop
	free    chan *qop
	splits  chan *qsplit  // free split states (queue_io.go), depth of them
	reap    chan struct{} // closed when the reaper has returned
	stopped chan struct{} // Close's last touch of the ring, before the reaper closes it
	// pending counts the fast-path requests not yet ended, slow the
	// goroutines that end requests off the reaper; zombies the abandoned
	// copies whose late completions have not arrived.
	pending sync.WaitGroup
	slow    sync.WaitGroup
	zombies atomic.Int64
	dirty   bool // SQEs prepared since the last Submit (submitter-owned)
	// idle, when set, runs after each batch of completions (blockdev.AsyncBackend).
	idle func()
	// ext marks a queue on its owner's ring (queue_ring.go): no reaper, the owner calls
	// Reap; tag is blockdev.RingTag there (0 otherwise), set on every SQE of the queue.
	ext bool
	tag uint64
	// live counts the fast-path requests not yet ended (pending's count, readable).
	live atomic.Int64

	// Who consumes completions (queue_wait.go): cqMu's holder; expect counts
	// the completions the ring owes; the reaper parks on kick (parked) when
	// none are owed. stopping is the reaper's; sw and waitTs the submitter's.
	cqMu      sync.Mutex
	expect    atomic.Int64
	parked    atomic.Bool
	kick      chan struct{}
	stopping  bool
	yield     uring.Yielder // the reaper's: it lives in io_uring_enter
	sw        syncDone
	waitTs    uring.Timespec
	selfWaits atomic.Uint64 // requests whose submitter waited on the ring itself
	// selfWaiting: the submitter has called ReadAt or WriteAt; only then
	// does the reaper park.
	selfWaiting atomic.Bool

	fast, fallbacks atomic.Uint64
	owned           atomic.Uint64 // requests ended inside Reap, on the owner (ring mode)
	abandoned       atomic.Uint64 // ring copies abandoned (abandonRing), for the tests' counts
	fixedCounters                 // zero copy (queue_ring_fixed.go)
}

// qop is one request in flight on the fast path.
type qop struct {
	q      *Queue
	idx    uint64
	op     opKind // opRead or opWrite
	done   Completer
	p      []byte
	off    int64 // array offset
	c      int64 // chunk
	region int64
	bk     *bucket
	cp     [2]pieceCopy // read: cp[0] is the copy read
	outs   [2]*atomic.Int64
	rms    [2]ringMember // the descriptors held (fastTarget)
	buf    *[]byte       // the ring's buffer while the deadline can abandon a copy
	left   atomic.Int32  // copies whose outcome is not known yet
	refs   atomic.Int32  // completions outstanding, +1 until the request ends
	gen    uint64        // submitter's: bumped each time o is freed
	// fixed: the data is fixed buffer fbuf of the owner's ring, not p
	// (queue_ring_fixed.go); unfit: a copy found that slot unfit for its
	// member; retry ends it untold.
	fixed, unfit bool
	fbuf         uring.Fixed
	retry        func()

	// Per copy, for the abandon scan (abandonRing): gen<<3 | copyOwnBuf if
	// its I/O uses o.buf | a copyState (copyMask),
	// and the member it went to.
	st  [2]atomic.Uint64
	ref [2]atomic.Pointer[memberRef]
}

// The state of one copy of a qop, in the low bits of qop.st.
const (
	copyIdle uint64 = iota
	copyPending
	copyDone
	copyAbandoned

	copyMask   uint64 = 3
	copyOwnBuf uint64 = 4 // the copy's I/O uses the queue's buffer, not the caller's
	copyShift         = 3 // of the generation
)

// user_data of an SQE: the op's index shifted left by two, the copy in bit
// 0; stopTag marks the reaper's stop request.
const stopTag = 1 << 1

// ErrNoRing is returned by NewQueue where io_uring cannot be set up (an old
// kernel, a seccomp profile that forbids it): the caller uses the
// synchronous path.
var ErrNoRing = errors.New("raid10: io_uring unavailable")

// NewQueue returns a Queue for depth requests in flight, with a ring of its
// own and a reaper goroutine. Close it before closing the array. It keeps
// the state of 3*depth requests: a request whose copy was abandoned (its
// member killed under it) ends at once, but its state stays until the late
// completion arrives, and the spare states keep the queue going meanwhile
// (one killed member per mirror pair, each with at most depth copies).
func (a *Array) NewQueue(depth int) (*Queue, error) { return a.newQueue(depth, nil) }

func (a *Array) newQueue(depth int, idle func()) (*Queue, error) {
	if depth <= 0 || depth > 4096 {
		return nil, invalidf("queue depth %d not in [1, 4096]", depth)
	}
	// Two SQEs per request (a write's two copies) and a stop NOP; prep
	// submits early if a caller prepares more.
	ring, err := uring.New(uint32(2*depth+1), 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoRing, err)
	}
	q := a.initQueue(ring, depth)
	q.idle = idle
	go q.reaper()
	return q, nil
}

// initQueue makes a Queue of depth requests on ring and registers it with
// the array (for abandonRing); the caller starts what completes it.
func (a *Array) initQueue(ring *uring.Ring, depth int) *Queue {
	n := 3 * depth
	q := &Queue{a: a, ring: ring, ops: make([]qop, n), free: make(chan *qop, n), reap: make(chan struct{}), stopped: make(chan struct{}, 1),
		kick: make(chan struct{}, 1), sw: syncDone{ch: make(chan error, 1)}, waitTs: uring.Timespec{Nsec: int64(waitTick)}}
	for i := range q.ops {
		o := &q.ops[i]
		o.q, o.idx = q, uint64(i)+1
		q.free <- o
	}
	q.splits = make(chan *qsplit, depth)
	for range depth {
		q.splits <- &qsplit{q: q}
	}
	a.queuesMu.Lock()
	a.queues[q] = struct{}{}
	a.queuesMu.Unlock()
	return q
}

// Submit hands the member I/O prepared since the last Submit to the kernel:
// one system call per batch. The submitter calls it after a batch of Read
// and Write calls, and before it waits for anything.
func (q *Queue) Submit() error {
	if !q.dirty || q.ext { // on the owner's ring, its own io_uring_enter submits
		return nil
	}
	q.dirty = false
	_, err := q.ring.Submit()
	q.kickReaper()
	return err
}

// Close waits for every request submitted to complete, stops the reaper and
// releases the ring. The submitter calls it, after its last Submit. Copies
// abandoned under a killed member may still be in their device: the reaper
// then stays for their late completions and releases the ring after them,
// and Close does not wait for it.
func (q *Queue) Close() error {
	if q.ext {
		return q.closeRing()
	}
	if err := q.Submit(); err != nil {
		return err
	}
	q.pending.Wait()
	q.slow.Wait()
	q.a.queuesMu.Lock() // no copy of it is pending now: nothing for abandonRing
	delete(q.a.queues, q)
	q.a.queuesMu.Unlock()
	sqe, err := q.getSQE()
	if err != nil {
		return err
	}
	sqe.PrepNop()
	sqe.UserData = stopTag
	q.expect.Add(1)
	if _, err := q.ring.Submit(); err != nil {
		return err
	}
	q.kickReaper()
	q.stopped <- struct{}{} // the reaper owns the ring from here
	if n := q.zombies.Load(); n > 0 {
		klog.InfoS("raid10: queue closed with abandoned member requests still in their device", "requests", n)
		return nil
	}
	<-q.reap
	return nil
}

// getSQE returns a submission slot, submitting what is prepared first when
// the ring is full.
func (q *Queue) getSQE() (*uring.SQE, error) {
	sqe, err := q.ring.GetSQE()
	if errors.Is(err, uring.ErrSQFull) {
		if _, err = q.ring.Submit(); err != nil {
			return nil, err
		}
		q.kickReaper()
		sqe, err = q.ring.GetSQE()
	}
	return sqe, err
}

// Stats returns how many requests took the fast path and how many fell back
// to the synchronous one.
func (q *Queue) Stats() (fast, fallbacks uint64) { return q.fast.Load(), q.fallbacks.Load() }

// Owned returns how many requests ended inside Reap, told on the owner's
// goroutine with no hand-off (a queue on its owner's ring; 0 otherwise).
func (q *Queue) Owned() uint64 { return q.owned.Load() }

// reapBatch bounds the completions the reaper delivers between two idle calls.
const reapBatch = 32

// reaper finishes requests from the ring's completions until Close, and
// parks while the ring owes none (queue_wait.go).
func (q *Queue) reaper() {
	defer close(q.reap)
	defer func() {
		if err := q.ring.Close(); err != nil {
			klog.ErrorS(err, "raid10: closing a queue's ring")
		}
	}()
	// It spends its life in io_uring_enter, locked to its thread; it never unlocks, so
	// that the thread ends with it: the runtime keeps an unlocked idle thread for good,
	// and a node that held 256 volumes kept 1,344 threads after they were gone
	// (make node-scale).
	runtime.LockOSThread()
	for {
		q.cqMu.Lock()
		done := q.reapOwed()
		q.cqMu.Unlock()
		if done {
			return
		}
		q.park()
	}
}

// fallback runs a request on the synchronous path in a goroutine of its own.
func (q *Queue) fallback(op opKind, p []byte, off int64, fua bool, done Completer) {
	q.fallbacks.Add(1)
	q.slow.Add(1)
	go func() {
		defer q.slow.Done()
		done.Complete(q.runSync(op, p, off, fua))
		q.batchDone()
	}()
}

// runSync runs a request on the synchronous path. Its limits were applied
// when the Queue took it (paced), so it does not pass them again.
func (q *Queue) runSync(op opKind, p []byte, off int64, fua bool) error {
	var err error
	if op == opRead {
		_, err = q.a.read(p, off, false)
	} else {
		_, err = q.a.write(opWrite, p, off, int64(len(p)), fua, false)
	}
	return err
}

// batchDone tells the frontend that the completions at hand are delivered.
func (q *Queue) batchDone() {
	if q.idle != nil {
		q.idle()
	}
}

// take returns a free op, waiting for one when depth requests are in flight
// (after submitting what is prepared, so that the wait ends). On its
// owner's ring it never waits (nothing would reap while it did): it
// returns nil, and the request takes the fallback.
func (q *Queue) take() *qop {
	select {
	case o := <-q.free:
		return o
	default:
	}
	if q.ext {
		return nil
	}
	q.submitQuietly()
	return <-q.free
}

// submitQuietly submits before a wait for what only the submitted requests
// give back; a failure is logged (the requests then never complete, which
// the member deadline does not cover: the ring itself failed).
func (q *Queue) submitQuietly() {
	if err := q.Submit(); err != nil {
		klog.ErrorS(err, "raid10: queue submit")
	}
}

// fastTarget returns where the piece's copy x goes on the ring, holding
// the member's descriptor (release it with ringDone), or ok false when the
// fast path cannot take it.
func (a *Array) fastTarget(x *pieceCopy, n int64) (rm ringMember, fd int, at int64, ok bool) {
	if x.r == nil || x.r.refused() != nil || x.r.bad.Load().overlaps(x.off/BlockSize, n/BlockSize) {
		return nil, 0, 0, false
	}
	if rm, ok = x.r.m.(ringMember); !ok {
		return nil, 0, 0, false
	}
	fd, at, ok = rm.ringTarget(x.off, n)
	return rm, fd, at, ok
}

// ringBuf is the buffer the ring reads into or writes from: the caller's
// own when no deadline is in force, else one of o's own, so that a copy the
// deadline abandons can land late without touching memory the caller has
// got back (as handedOff's bounce buffers).
func (q *Queue) ringBuf(o *qop) []byte {
	if o.fixed || q.a.timeout() <= 0 {
		return o.p
	}
	o.buf = getBounce(len(o.p))
	b := (*o.buf)[:len(o.p)]
	if o.op == opWrite {
		copy(b, o.p)
	}
	return b
}

// prep puts one member I/O of o (copy k) on the ring.
func (q *Queue) prep(o *qop, k int, rm ringMember, fd int, at int64, buf []byte) {
	sqe, err := q.getSQE()
	if err != nil {
		// Only a ring closed under its submitter (Close before the last
		// Read or Write) gets here.
		panic(fmt.Sprintf("raid10: queue ring: %v", err))
	}
	prepIO(sqe, o, fd, at, buf)
	sqe.UserData = q.tag | o.idx<<2 | uint64(k)
	q.expect.Add(1)
	x := &o.cp[k]
	out := &x.r.out[q.a.epoch.Load()%epochRing]
	out.Add(1)
	o.outs[k], o.rms[k] = out, rm
	x.s.inflight.Add(1)
	o.ref[k].Store(x.r)
	st := o.gen<<copyShift | copyPending
	if o.buf != nil {
		st |= copyOwnBuf
	}
	o.st[k].Store(st)
	q.dirty = true
}

// abandonRing gives up on every copy in flight on the rings to r, a member
// being failed (its deadline passed, or it was taken out): each such copy
// ends with errTimedOut, so its request completes from the other copy,
// while the ring I/O itself stays outstanding, counted as a zombie of its
// storage until its completion arrives.
func (a *Array) abandonRing(r *memberRef) {
	a.queuesMu.Lock()
	defer a.queuesMu.Unlock()
	for q := range a.queues {
		for i := range q.ops {
			o := &q.ops[i]
			for k := range o.st {
				w := o.st[k].Load()
				// A copy whose I/O targets the caller's buffer (no deadline in
				// force) cannot be abandoned: its late landing would write
				// into memory the caller got back. Its request waits for it,
				// as an inline call does.
				if w&copyMask != copyPending || w&copyOwnBuf == 0 || o.ref[k].Load() != r {
					continue
				}
				a.zombieMu.Lock()
				won := o.st[k].CompareAndSwap(w, w&^copyMask|copyAbandoned)
				if won {
					a.zombies[zombieKey(r.m)]++
					q.zombies.Add(1)
					q.abandoned.Add(1)
				}
				a.zombieMu.Unlock()
				if won {
					o.outcome(k, errTimedOut)
				}
			}
		}
	}
}
