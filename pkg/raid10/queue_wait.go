package raid10

import (
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// Who consumes a Queue's completions (a Queue with a reaper; a queue on its
// owner's ring has none, queue_ring.go).
//
// At queue depth 1 a reaper costs two thread wake-ups per request: the
// kernel wakes the reaper out of io_uring_enter, and the reaper wakes the
// submitter through its Completer. So the completion ring has one consumer
// at a time, whoever holds cqMu:
//
//   - The reaper holds it and waits in io_uring_enter. Once the submitter
//     has waited for a request itself (selfWaiting), the reaper lets go
//     whenever the ring owes nothing (expect == 0; expect counts SQEs
//     prepared or in flight, abandoned copies included) and parks on kick,
//     off the kernel; Submit kicks it when it finds it parked. A submitter
//     that never waits itself (NBD at depth) keeps the reaper in the kernel,
//     as before: a parked reaper costs one more wake-up when requests come
//     after an idle moment.
//   - ReadAt and WriteAt, the submitter's calls for a request it will wait
//     for anyway (a lone request), take cqMu when the reaper has let go: the
//     submitter then submits and waits in one io_uring_enter and finishes
//     its own request from the completion, with no other thread woken. The
//     wait is bounded (waitTick), so a request that leaves the ring (a
//     fallback, a member error, a copy abandoned by the member deadline) is
//     seen ending on its goroutine. When the reaper is busy with requests
//     in flight, they take the usual way (Read or Write, then wait).

// waitTick bounds each wait of ReadAt and WriteAt in io_uring_enter.
const waitTick = 10 * time.Millisecond

// syncDone is the Completer of ReadAt and WriteAt (one at a time: the
// submitter's).
type syncDone struct{ ch chan error }

// Complete implements Completer.
func (s *syncDone) Complete(err error) { s.ch <- err }

// ReadAt reads len(p) bytes at off through the queue and returns when they
// are there; the submitter calls it instead of Read for a request it would
// wait for anyway. On an idle ring the submitter itself waits for the
// completion (see above).
func (q *Queue) ReadAt(p []byte, off int64) (int, error) {
	if err := q.await(opRead, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt writes p at off through the queue and returns once the rules of
// Array.WriteAt allow it, as ReadAt does for a read.
func (q *Queue) WriteAt(p []byte, off int64) (int, error) {
	if err := q.await(opWrite, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// await runs one request and waits for it.
func (q *Queue) await(op opKind, p []byte, off int64) error {
	sw := &q.sw
	if !q.ext && q.ring.CanWaitTimeout() && !q.selfWaiting.Load() {
		q.selfWaiting.Store(true) // the reaper lets go once this request ends
	}
	own := q.selfWaiting.Load() && q.cqMu.TryLock()
	if op == opRead {
		q.Read(p, off, sw)
	} else {
		q.Write(p, off, false, sw)
	}
	if !own {
		q.submitQuietly()
		return <-sw.ch
	}
	q.selfWaits.Add(1)
	defer q.letGo()
	for {
		select {
		case err := <-sw.ch:
			return err
		default:
		}
		if q.expect.Load() == 0 { // it left the ring: its goroutine tells
			return <-sw.ch
		}
		q.dirty = false
		if err := q.ring.SubmitAndWaitTimeout(1, &q.waitTs); err != nil {
			// The ring itself failed: as a failed Submit, nothing will
			// complete it; the reaper logs the same error.
			return fmt.Errorf("raid10: queue wait: %w", err)
		}
		for {
			cqe, ok := q.ring.PeekCQE()
			if !ok {
				break
			}
			q.ring.SeenCQE()
			q.consume(cqe)
		}
	}
}

// letGo hands the completion ring back after await; the reaper takes the
// completions still owed (copies abandoned while the submitter waited).
func (q *Queue) letGo() {
	q.cqMu.Unlock()
	if q.expect.Load() > 0 {
		q.kickReaper()
	}
}

// consume finishes the member I/O of one completion other than Close's
// stop NOP, on whichever side holds cqMu.
func (q *Queue) consume(cqe uring.CQE) {
	q.expect.Add(-1)
	o := &q.ops[(cqe.UserData&^q.tag)>>2-1]
	o.completed(int(cqe.UserData&1), cqe.Res)
}

// kickReaper wakes the reaper when it is parked (or about to park).
func (q *Queue) kickReaper() {
	if q.parked.Load() {
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
}

// park waits off the kernel until Submit has something for the reaper. A
// submitter that adds to expect after the reaper's look sees parked and
// kicks; one before it is seen here.
func (q *Queue) park() {
	q.parked.Store(true)
	if q.expect.Load() == 0 {
		<-q.kick
	}
	q.parked.Store(false)
}

// reapOwed consumes completions while the ring owes some; it returns true
// once the reaper is done for good (Close's stop seen and every state
// free, or the ring failed).
func (q *Queue) reapOwed() bool {
	batch := 0
	for {
		cqe, ok := q.ring.PeekCQE()
		if batch++; !ok || batch%reapBatch == 0 {
			q.batchDone() // also within a long run of completions: no reply waits long
		}
		if !ok {
			if q.stopping && len(q.free) == len(q.ops) {
				return true
			}
			if q.expect.Load() == 0 && q.selfWaiting.Load() {
				return false
			}
			q.yield.Yield()
			if err := q.ring.WaitCompletions(1); err != nil {
				klog.ErrorS(err, "raid10: queue reaper stops")
				return true
			}
			continue
		}
		q.ring.SeenCQE()
		if cqe.UserData == stopTag {
			q.expect.Add(-1)
			<-q.stopped // Close is done with the ring
			q.stopping = true
			continue
		}
		q.consume(cqe)
	}
}
