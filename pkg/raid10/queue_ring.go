package raid10

import (
	"fmt"
	"runtime"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// A Queue on its owner's ring (blockdev.RingQueue): the owner (a ublk queue
// thread) drives one io_uring for its own commands and for the member I/O
// of its requests, so a request is fetched, its member I/O submitted, its
// completions reaped and its result committed by one thread, with no
// goroutine and no wake-up in between.
//
// The rules stay the engine's: Read and Write choose the fast path or the
// fallback exactly as on a Queue with a reaper, and a member error, a
// member past its deadline (abandonRing) or a write that needs the failure
// rules still leave the ring for a goroutine of the queue's, which tells
// the request's Completer from there. What changes:
//
//   - There is no reaper: the owner passes every completion whose user_data
//     has blockdev.RingTag to Reap, which runs the completion rules the
//     reaper runs, on the owner's goroutine. A request that ends there is
//     told through CompleteOnOwner when its Completer has it.
//   - user_data of the queue's SQEs: blockdev.RingTag | op index<<2 | copy
//     (op indexes start at 1); RingTag alone (index 0) is Close's timer.
//   - Read and Write never wait for a free state (nothing would reap while
//     they did): without one, the request takes the fallback.
//   - Submit does nothing: the owner's next io_uring_enter submits.
//   - Close reaps the ring itself until every request has ended, then
//     closes the ring, or leaves it to a goroutine while copies abandoned
//     by the deadline are still in their device (their buffers stay
//     referenced until their completions are seen).

var _ blockdev.RingBackend = (*Array)(nil)

// ringTimerTag is the user_data of Close's wake-up timer.
const ringTimerTag = blockdev.RingTag

// NewRingQueue implements blockdev.RingBackend: a Queue of depth requests
// whose member I/O goes on ring, which its caller owns and drives (see
// above). ring needs room for two SQEs per request besides the caller's
// own. The Queue closes ring in Close.
func (a *Array) NewRingQueue(ring *uring.Ring, depth int) (blockdev.RingQueue, error) {
	if depth <= 0 || depth > 4096 {
		return nil, invalidf("queue depth %d not in [1, 4096]", depth)
	}
	if ring == nil {
		return nil, invalidf("ring queue without a ring")
	}
	q := a.initQueue(ring, depth)
	q.ext, q.tag = true, blockdev.RingTag
	close(q.reap) // no reaper
	return q, nil
}

// Reap implements blockdev.RingQueue: it runs the completion rules for one
// completion of the owner's ring that carries blockdev.RingTag.
func (q *Queue) Reap(cqe uring.CQE) {
	idx := (cqe.UserData &^ blockdev.RingTag) >> 2
	if idx == 0 { // Close's timer
		return
	}
	if idx > uint64(len(q.ops)) {
		klog.ErrorS(fmt.Errorf("raid10: completion %#x names no request of the queue", cqe.UserData), "raid10: ring queue")
		return
	}
	q.consume(cqe)
}

// tell gives a request's outcome to its Completer: on the owner's
// goroutine through CompleteOnOwner where it has one.
func tell(done Completer, err error, owner bool) {
	if oc, ok := done.(blockdev.OwnerCompleter); ok && owner {
		oc.CompleteOnOwner(err)
		return
	}
	done.Complete(err)
}

// closeTick bounds how long Close waits on the ring before it looks again
// at the requests that left it (fallbacks and recoveries end elsewhere).
const closeTick = 5 * time.Millisecond

// closeRing is Close on the owner's ring: the owner's other completions are
// dropped (it calls Close once it is done with its ring).
func (q *Queue) closeRing() error {
	// The kernel reads ts when the timeout is submitted, at an address taken before: on the
	// heap and pinned, as a variable of this frame would move with the stack if it grew on
	// the way to the submission.
	var pin runtime.Pinner
	ts := &uring.Timespec{Nsec: int64(closeTick)}
	pin.Pin(ts)
	defer pin.Unpin()
	armed := false
	for q.live.Load() > 0 || armed { // the timer reads ts: wait for it too
		if cqe, ok := q.ring.PeekCQE(); ok {
			q.ring.SeenCQE()
			if cqe.UserData&blockdev.RingTag != 0 {
				armed = armed && cqe.UserData != ringTimerTag
				q.Reap(cqe)
			}
			continue
		}
		if !armed {
			sqe, err := q.getSQE()
			if err != nil {
				return fmt.Errorf("raid10: closing a ring queue: %w", err)
			}
			sqe.PrepTimeout(ts)
			sqe.UserData = ringTimerTag
			armed = true
		}
		if _, err := q.ring.SubmitAndWait(1); err != nil {
			return fmt.Errorf("raid10: closing a ring queue: %w", err)
		}
	}
	q.pending.Wait()
	q.slow.Wait()
	q.a.queuesMu.Lock() // no copy of it is pending now: nothing for abandonRing
	delete(q.a.queues, q)
	q.a.queuesMu.Unlock()
	if n := q.zombies.Load(); n > 0 {
		klog.InfoS("raid10: ring queue closed with abandoned member requests still in their device", "requests", n)
		go q.drainRing() // it keeps q, and so their buffers, alive
		return nil
	}
	return q.ring.Close()
}

// drainRing waits for the late completions of abandoned copies, then
// closes the ring. It only waits on the ring (a single-issuer ring takes
// submissions from the owner only).
func (q *Queue) drainRing() {
	defer func() {
		if err := q.ring.Close(); err != nil {
			klog.ErrorS(err, "raid10: closing a ring queue's ring")
		}
	}()
	for q.zombies.Load() > 0 {
		cqe, ok := q.ring.PeekCQE()
		if !ok {
			if err := q.ring.WaitCompletions(1); err != nil {
				klog.ErrorS(err, "raid10: ring queue stops waiting for abandoned requests")
				return
			}
			continue
		}
		q.ring.SeenCQE()
		if cqe.UserData&blockdev.RingTag != 0 {
			q.Reap(cqe)
		}
	}
}
