package raid10

import (
	"sync/atomic"
	"syscall"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// Zero copy on the owner's ring: a request whose data is a fixed buffer of
// the ring (ublk's automatic buffer registration puts each fetched
// request's own pages in a slot of the queue thread's ring) has its member
// I/O read into or write from that slot (READ_FIXED, WRITE_FIXED; for a
// kernel buffer from its byte 0), with no copy through memory of the engine's or the caller's.
//
// What it takes: the fast path's conditions (one chunk, members opened
// O_DIRECT, no barrier, no bad block, no copy hook, durable bitmap bit, no
// FUA), and no QoS limits in force (a paced request would run later on the
// synchronous path, which has no access to the slot). Otherwise
// ReadFixed/WriteFixed report false with nothing started and the caller
// serves the request the copying way (Read, Write on its own buffer).
//
// What changes against the copying fast path:
//
//   - The member deadline does not abandon a fixed copy: its I/O is on the
//     request's own pages, which the kernel keeps (and does not complete
//     the request) until that I/O ends, so an abandoned copy would hold
//     its request anyway. A member that fails its deadline is failed as
//     always, so later requests leave it; the requests already on it wait
//     for its own completion (the device's timeout bounds it, as md's
//     requests wait). The fast path already leaves members whose calls
//     the deadline hands to workers (rescue), so only I/O started while
//     the member looked healthy waits.
//   - A read that fails on its member is not served here: the synchronous
//     read path (readSlow, other copies, the rewrite) needs memory of its
//     own, so the request ends through retry, untold, and the caller serves
//     it again the copying way, which runs those rules. The same holds for
//     a write refused because the slot does not suit the member's direct
//     I/O (EINVAL, EFAULT: nothing was written by that copy); other write
//     errors take the failure rules of finishWrite as on the copying path
//     (they need no data).

// FixedStats returns how many requests took the zero-copy fast path and how
// many of those ended through retry.
func (q *Queue) FixedStats() (fixed, retried uint64) { return q.fixedOps.Load(), q.fixedRetries.Load() }

// ReadFixed reads len(p) bytes at off into fixed buffer buf of the owner's
// ring and tells done on the owner's goroutine,
// inside Reap; p gives only the length and alignment (the caller's
// copying buffer, untouched here). It reports false with nothing started
// where the zero-copy path cannot take the request, and the caller serves
// it with Read. A request it took that fails ends through retry instead of
// done (see above). Only on a queue of its owner's ring.
func (q *Queue) ReadFixed(p []byte, off int64, buf uring.Fixed, done blockdev.OwnerCompleter, retry func()) bool {
	return q.startFixed(opRead, p, off, buf, done, retry)
}

// WriteFixed writes len(p) bytes from fixed buffer buf of the owner's ring to every live copy at off, as Write does, p giving only the length.
// It reports false as ReadFixed; a request it took is told to done (with
// the outcome of the failure rules), or ends through retry when the slot
// did not suit a member's direct I/O.
func (q *Queue) WriteFixed(p []byte, off int64, buf uring.Fixed, done blockdev.OwnerCompleter, retry func()) bool {
	return q.startFixed(opWrite, p, off, buf, done, retry)
}

func (q *Queue) startFixed(op opKind, p []byte, off int64, buf uring.Fixed, done blockdev.OwnerCompleter, retry func()) bool {
	a, n := q.a, int64(len(p))
	if !q.ext || n == 0 || !isAligned(p) || a.check(off, n, false) != nil ||
		off&(a.geo.chunk-1)+n > a.geo.chunk || a.qos.lim.Load() != nil {
		return false
	}
	o := q.take()
	if o == nil {
		return false
	}
	o.fixed, o.fbuf, o.retry = true, buf, retry
	if !q.launch(o, op, p, off, done) {
		return false
	}
	q.fixedOps.Add(1)
	return true
}

// prepIO makes sqe the member I/O of o at at on fd: on buf, or on o's fixed
// buffer.
func prepIO(sqe *uring.SQE, o *qop, fd int, at int64, buf []byte) {
	switch {
	case o.fixed && o.op == opRead:
		sqe.PrepReadFixed(fd, o.fbuf.Addr, uint32(len(o.p)), uint64(at), o.fbuf.Index)
	case o.fixed:
		sqe.PrepWriteFixed(fd, o.fbuf.Addr, uint32(len(o.p)), uint64(at), o.fbuf.Index)
	case o.op == opRead:
		sqe.PrepRead(fd, buf, uint64(at))
	default:
		sqe.PrepWrite(fd, buf, uint64(at))
	}
}

// fixedUnfit reports whether a fixed copy's result says the slot did not
// suit the member's I/O (its alignment, its direction), not a member fault.
func fixedUnfit(res int32) bool {
	return res == -int32(syscall.EINVAL) || res == -int32(syscall.EFAULT)
}

// endFixed ends a fixed request whose copies' outcomes are all known (failed
// as outcome has it), on the owner's goroutine: a fixed copy is never
// abandoned, so its outcome comes from its completion, inside Reap. It
// reports false where the copying path's rules take over: a write's
// failure rules.
func (o *qop) endFixed(failed bool) bool {
	switch {
	case !failed:
		o.finish(nil, true)
	case o.op == opRead || o.unfit:
		o.retryCopying()
	default:
		return false
	}
	return true
}

// retryCopying ends a fixed request untold: its caller serves it again the
// copying way.
func (o *qop) retryCopying() {
	a, q := o.q.a, o.q
	if o.op == opWrite {
		a.bm.endWrite(o.region)
	}
	if o.bk != nil {
		a.exit(o.bk)
	}
	retry := o.retry
	o.release()
	q.fixedRetries.Add(1)
	retry()
	q.live.Add(-1)
	q.pending.Done()
}

// fixedCounters are a Queue's zero-copy counts (FixedStats).
type fixedCounters struct {
	fixedOps, fixedRetries atomic.Uint64
}
