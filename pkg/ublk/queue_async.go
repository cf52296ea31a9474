package ublk

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// The asynchronous path of a queue: where the backend is a blockdev.AsyncBackend (the engine
// on io_uring), the queue thread submits the member I/O of reads and plain writes to a queue
// of its own instead of handing each request to a goroutine that blocks in the backend; the
// completion hands the result back through queue.complete, as the goroutine would.

// tagDone is the preallocated Completer of one tag.
type tagDone struct {
	q     *queue
	tag   uint16
	read  bool
	bytes int64
	// retryFn is retry (zerocopy.go), made once: the engine's ReadFixed/WriteFixed take it.
	retryFn func()
}

// Complete implements blockdev.Completer: from a goroutine of the backend's, handed back
// through queue.complete.
func (t *tagDone) Complete(err error) {
	q := t.q
	t.countZeroCopy(err)
	q.complete(t.tag, t.result(err))
	q.serving.Done()
}

// result counts the request and returns its result for COMMIT_AND_FETCH.
func (t *tagDone) result(err error) int32 {
	q := t.q
	res := int32(t.bytes)
	if t.read {
		q.stats.reads.Add(1)
		q.stats.bytesRead.Add(uint64(t.bytes))
	} else {
		q.stats.writes.Add(1)
		q.stats.bytesWritten.Add(uint64(t.bytes))
	}
	if err != nil {
		res = -int32(blockdev.Errno(err))
		q.stats.errors.Add(1)
		klog.V(2).InfoS("ublk request failed", "device", q.d.id, "read", t.read, "length", t.bytes, "err", err)
	}
	return res
}

// openAsync opens the thread's queue on the backend: one on the thread's own ring (ring.go)
// where the backend has them, else an asynchronous queue with a completer of its own; without
// either (no io_uring for the backend) every request goes to a goroutine, as before.
func (q *queue) openAsync() {
	if !q.openRingQueue() {
		ab, ok := q.d.backend.(blockdev.AsyncBackend)
		if !ok {
			return
		}
		aq, err := ab.NewAsyncQueue(q.depth, nil)
		if err != nil {
			klog.InfoS("ublk queue serves through the blocking calls: no asynchronous queue", "device", q.d.id, "queue", q.id, "err", err)
			return
		}
		q.aq = aq
	}
	q.dones = make([]tagDone, q.depth)
	for i := range q.dones {
		q.dones[i] = tagDone{q: q, tag: uint16(i)}
		q.dones[i].retryFn = q.dones[i].retry
	}
	if q.zc != nil {
		q.zc.fq, _ = q.rq.(fixedQueue)
	}
}

// queued submits the request of tag to the asynchronous queue and reports whether it did: a
// read, or a write without FUA. The queue thread submits the batch before it waits.
func (q *queue) queued(tag uint16) bool {
	if q.aq == nil {
		return false
	}
	op, flags, off, n := q.request(tag)
	t := &q.dones[tag]
	t.bytes = n
	switch {
	case op == opRead:
		t.read = true
		q.aq.Read(q.buf(tag)[:n], off, t)
	case op == opWrite && flags&ioFlagFUA == 0:
		t.read = false
		q.aq.Write(q.buf(tag)[:n], off, false, t)
	default:
		return false
	}
	return true
}
