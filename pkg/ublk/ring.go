package ublk

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// One ring per queue: where the backend is a blockdev.RingBackend (the engine), the queue
// thread's ring carries both its ublk commands and the member I/O of its requests. The thread
// fetches a request, submits its member reads or writes on the same ring (the engine decides
// how, queue_async.go's queued), waits on that one ring, and commits the request
// (COMMIT_AND_FETCH) when the engine ends it inside Reap: no goroutine, no eventfd and no
// lock between the fetch and the commit, and one io_uring_enter carries a whole batch of
// commits and member I/O.
//
// user_data on the queue's ring:
//
//	bit 63 set (blockdev.RingTag)  member I/O of the engine's queue: handed to Reap
//	wakeTag (1<<32)                the eventfd read that wakes the thread
//	copyInTag|tag, copyOutTag|tag  zero copy's copies of a tag's data (zerocopy.go)
//	below 4096                     FETCH / COMMIT_AND_FETCH of that tag
//
// Requests the engine does not end on the ring (fallbacks: FUA, flush, multi-chunk without a
// free state, barriers, bad blocks, copy hooks; member errors and deadlines, which take the
// engine's synchronous rules) are told from the engine's goroutines and handed back through
// queue.complete and the eventfd, as before.

// ringEntries is the size of the queue thread's ring: every tag's command, the wake read, and
// with a ring queue room for two member SQEs per tag (a write's two copies).
func (q *queue) ringEntries() uint32 {
	if _, ok := q.d.backend.(blockdev.RingBackend); ok {
		return pow2(3*q.depth + 1)
	}
	return pow2(q.depth + 1)
}

// openRingQueue puts the backend's member I/O on the thread's ring; false when the backend
// has no ring queues or refused one (the caller then tries an asynchronous queue).
func (q *queue) openRingQueue() bool {
	rb, ok := q.d.backend.(blockdev.RingBackend)
	if !ok {
		return false
	}
	rq, err := rb.NewRingQueue(q.ring, q.depth)
	if err != nil {
		klog.InfoS("ublk queue without a ring queue", "device", q.d.id, "queue", q.id, "err", err)
		return false
	}
	q.rq, q.aq = rq, rq
	return true
}

// CompleteOnOwner implements blockdev.OwnerCompleter: the engine ended the request inside
// Reap, on the queue thread, which commits it before it next waits.
func (t *tagDone) CompleteOnOwner(err error) {
	q := t.q
	t.countZeroCopy(err)
	q.owned = append(q.owned, completion{t.tag, t.result(err)})
	q.stats.onRing.Add(1)
	q.serving.Done()
}

// RingServed is how many requests the device's queue threads ended on their own ring, with
// no hand-off (the engine's fast path).
func (d *Device) RingServed() uint64 {
	var n uint64
	for _, q := range d.queues {
		n += q.stats.onRing.Load()
	}
	return n
}
