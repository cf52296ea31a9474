package raid10

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"k8s.io/klog/v2"
)

// The fast path of a Queue: a read or a write of one chunk piece admitted
// without waiting, its member I/O prepared on the ring, and its end when
// the member completions arrive (queue.go says when a request takes it).

// Read reads len(p) bytes at off into p and tells done. p must stay
// untouched until then. off and len(p) must be multiples of BlockSize.
func (q *Queue) Read(p []byte, off int64, done Completer) {
	if q.paced(opRead, p, off, false, done) {
		return
	}
	q.start(opRead, p, off, false, done)
}

// Write writes p at off to every live copy and tells done once the rules of
// WriteAt allow it to be acknowledged; with fua, once it is durable. p must
// stay untouched until then.
func (q *Queue) Write(p []byte, off int64, fua bool, done Completer) {
	if q.paced(opWrite, p, off, fua, done) {
		return
	}
	q.start(opWrite, p, off, fua, done)
}

func (q *Queue) start(op opKind, p []byte, off int64, fua bool, done Completer) {
	a, n := q.a, int64(len(p))
	if n == 0 || fua || !isAligned(p) || a.check(off, n, false) != nil {
		q.fallback(op, p, off, fua, done) // the synchronous path reports a bad request
		return
	}
	if off&(a.geo.chunk-1)+n > a.geo.chunk {
		q.split(op, p, off, done)
		return
	}
	o := q.take()
	if o == nil { // on the owner's ring with every state in use
		q.fallback(op, p, off, fua, done)
		return
	}
	if !q.launch(o, op, p, off, done) {
		q.fallback(op, p, off, fua, done)
	}
}

// launch starts o, a state taken from q.free (with ReadFixed's fields set when
// it is one of those), as the single-chunk request op of p at off: it reports
// false, with o back on q.free and nothing started, where the fast path cannot
// take it now.
func (q *Queue) launch(o *qop, op opKind, p []byte, off int64, done Completer) bool {
	a := q.a
	q.pending.Add(1)
	q.live.Add(1)
	o.op, o.p, o.off, o.done = op, p, off, done
	o.c, o.region = off>>a.geo.chunkShift, off/a.geo.region
	var ok bool
	if op == opRead {
		ok = q.startRead(o)
	} else {
		ok = q.startWrite(o)
	}
	if !ok {
		o.p, o.done, o.fixed, o.retry = nil, nil, false, nil
		q.live.Add(-1)
		q.pending.Done()
		q.free <- o
		return false
	}
	q.fast.Add(1)
	return true
}

// qsplit is a request of several chunk pieces: each piece goes through the
// queue as a request of its own (the fast path or the synchronous one, each
// on its merits), and the last piece to end tells the caller, with the
// first error of any.
type qsplit struct {
	q    *Queue
	done Completer
	left atomic.Int32
	mu   sync.Mutex // guards err; taken only on an error
	err  error
}

// split starts a request that spans chunks as one request per chunk piece.
func (q *Queue) split(op opKind, p []byte, off int64, done Completer) {
	chunk := q.a.geo.chunk
	var s *qsplit
	select {
	case s = <-q.splits:
	default:
		if q.ext { // never wait on the owner's ring: the synchronous path splits it
			q.fallback(op, p, off, false, done)
			return
		}
		q.submitQuietly()
		s = <-q.splits
	}
	s.done = done
	n := int64(len(p))
	first := chunk - off&(chunk-1)
	s.left.Store(int32(1 + (n-first+chunk-1)/chunk))
	for i := int64(0); i < n; {
		k := min(n-i, chunk-(off+i)&(chunk-1))
		q.start(op, p[i:i+k], off+i, false, s)
		i += k
	}
}

// Complete implements Completer for the pieces.
func (s *qsplit) Complete(err error) { s.end(err, false) }

// CompleteOnOwner implements blockdev.OwnerCompleter: a piece ended inside
// Reap; if it is the last, the caller is told there too.
func (s *qsplit) CompleteOnOwner(err error) { s.end(err, true) }

// end records a piece's outcome; the last piece tells the caller, on the
// owner's goroutine when owner.
func (s *qsplit) end(err error, owner bool) {
	if err != nil {
		s.mu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
	}
	if s.left.Add(-1) > 0 {
		return
	}
	done, err := s.done, s.err
	s.done, s.err = nil, nil
	s.q.splits <- s
	tell(done, err, owner)
}

// startRead admits a read and prepares its member read, or reports false
// with nothing taken.
func (q *Queue) startRead(o *qop) bool {
	a, n := q.a, int64(len(o.p))
	bk, ok := a.tryEnter(o.c)
	if !ok {
		return false
	}
	if h, _ := a.pendingHydrate(o.off, n); h != nil {
		a.exit(bk)
		return false
	}
	s, r, moff := a.readCopy(o.c, o.off, copyAny)
	o.cp[0] = pieceCopy{s: s, r: r, off: moff}
	rm, fd, at, ok := a.fastTarget(&o.cp[0], n)
	if !ok {
		a.exit(bk)
		return false
	}
	o.bk = bk
	bk.rOps.Add(1)
	bk.rBytes.Add(uint64(n))
	o.left.Store(1)
	o.refs.Store(2)
	q.prep(o, 0, rm, fd, at, q.ringBuf(o))
	return true
}

// startWrite admits a write under its region's durable bitmap bit and
// prepares the write of every live copy, or reports false with nothing
// taken.
func (q *Queue) startWrite(o *qop) bool {
	a, n := q.a, int64(len(o.p))
	bk, ok := a.tryEnter(o.c)
	if !ok {
		return false
	}
	if h, _, _ := a.pendingCopy(o.off, n); h != nil || !a.bm.tryStartWrite(o.region) {
		a.exit(bk)
		return false
	}
	o.cp = a.pieceCopies(o.c, o.off)
	var rms [2]ringMember
	var fds [2]int
	var ats [2]int64
	live := int32(0)
	for k := range o.cp {
		if o.cp[k].r == nil {
			continue
		}
		if rms[k], fds[k], ats[k], ok = a.fastTarget(&o.cp[k], n); !ok {
			for _, rm := range rms[:k] {
				if rm != nil {
					rm.ringDone()
				}
			}
			live = 0
			break
		}
		live++
	}
	if live == 0 { // no live copy: the synchronous path fails the write
		a.bm.endWrite(o.region)
		a.exit(bk)
		return false
	}
	o.bk = bk
	bk.wOps.Add(1)
	bk.wBytes.Add(uint64(n))
	o.left.Store(live)
	o.refs.Store(live + 1)
	buf := q.ringBuf(o)
	for k := range o.cp {
		if rms[k] != nil {
			q.prep(o, k, rms[k], fds[k], ats[k], buf)
		}
	}
	return true
}

// completed is the ring's completion of copy k of o, with res the
// kernel's result. Unless the copy was abandoned meanwhile, it is the
// copy's outcome.
func (o *qop) completed(k int, res int32) {
	w := o.st[k].Load() // orders the submitter's writes to o before the reads below
	a, n := o.q.a, int64(len(o.p))
	x := &o.cp[k]
	r := o.ref[k].Load()
	o.outs[k].Add(-1)
	o.rms[k].ringDone()
	x.s.inflight.Add(-1)
	if w&copyMask != copyPending || !o.st[k].CompareAndSwap(w, w&^copyMask|copyDone) {
		// Abandoned: the late I/O is over; the member may be added back.
		a.unzombie(r.m)
		o.q.zombies.Add(-1)
		klog.InfoS("raid10: abandoned ring request completed late", "member", x.s.idx, "res", res)
		o.release()
		return
	}
	var err error
	switch {
	case res < 0:
		err = fmt.Errorf("member %d: ring %s at %d: %w", x.s.idx, opName(o.op), x.off, syscall.Errno(-res))
	case int64(res) != n:
		err = fmt.Errorf("member %d: short ring %s %d of %d at %d", x.s.idx, opName(o.op), res, n, x.off)
	}
	if o.fixed && fixedUnfit(res) {
		o.unfit = true
	}
	if o.op == opRead {
		x.s.headPos.Store(x.off + n)
		x.s.readOps.Add(1)
		x.s.readBytes.Add(uint64(n))
	} else {
		x.s.writeOps.Add(1)
		x.s.wrBytes.Add(uint64(n))
	}
	o.outcome(k, err)
	o.release()
}

// outcome records how copy k of o ended (from its completion, or
// errTimedOut when abandoned); the last copy's outcome ends the request.
func (o *qop) outcome(k int, err error) {
	x := &o.cp[k]
	x.err = err
	if err != nil {
		if o.op == opRead {
			x.s.readErrs.Add(1)
		} else {
			x.s.writeErrs.Add(1)
		}
		klog.V(2).InfoS("raid10: member error on the ring", "member", x.s.idx, "offset", x.off, "err", err)
	}
	if o.left.Add(-1) > 0 {
		return
	}
	failed := o.cp[0].err != nil || o.cp[1].err != nil
	if !failed && o.op == opWrite {
		// No error: the rules of acknowledged hold without failing anyone.
		failed = !o.q.a.acknowledged(&o.cp, int64(len(o.p)))
	}
	if o.fixed && o.endFixed(failed) {
		return
	}
	if !failed {
		if o.op == opRead && o.buf != nil {
			copy(o.p, *o.buf)
		}
		// Here only from completed: on the reaper, or inside the
		// owner's Reap on a queue of its ring.
		o.finish(nil, o.q.ext)
		return
	}
	// Errors take the synchronous rules, which may write superblocks: not
	// on the reaper (nor on the deadline monitor, for an abandoned copy).
	o.q.slow.Add(1)
	go func() {
		defer o.q.slow.Done()
		o.finish(o.recover(), false)
		o.q.batchDone()
	}()
}

// recover serves a request whose member I/O failed: a read from a good
// copy through readSlow (rewriting the failed one), a write by the failure
// and acknowledgement rules of finishWrite.
func (o *qop) recover() error {
	a := o.q.a
	if o.op == opWrite {
		return a.finishWrite(&o.cp, opWrite, o.c, o.region, int64(len(o.p)))
	}
	// As readPiece: the slow path raises this bucket's barrier, so leave
	// it first; the slow-path counter keeps Close waiting.
	a.slowOps.Add(1)
	defer a.slowOps.Add(-1)
	a.exit(o.bk)
	o.bk = nil
	return a.readSlow(o.p, o.off, o.c)
}

// finish leaves the bucket (and a write's bitmap bit), ends the request's
// hold on o and tells its Completer (on the owner's goroutine when owner).
func (o *qop) finish(err error, owner bool) {
	a := o.q.a
	if o.op == opWrite {
		a.bm.endWrite(o.region)
	}
	if o.bk != nil {
		a.exit(o.bk)
	}
	done, q := o.done, o.q
	o.release()
	if owner {
		q.owned.Add(1)
	}
	tell(done, err, owner)
	q.live.Add(-1)
	q.pending.Done()
}

// release drops one hold on o (a completion, or the request's end); the
// last one frees it, with its buffer, for the next request.
func (o *qop) release() {
	if o.refs.Add(-1) > 0 {
		return
	}
	if o.buf != nil {
		putBounce(o.buf)
	}
	o.gen++
	for k := range o.st {
		o.st[k].Store(o.gen << copyShift) // copyIdle: 0
		o.ref[k].Store(nil)
	}
	o.bk, o.p, o.done, o.buf = nil, nil, nil, nil
	o.fixed, o.unfit, o.retry = false, false, nil
	o.cp, o.outs, o.rms = [2]pieceCopy{}, [2]*atomic.Int64{}, [2]ringMember{}
	o.q.free <- o
}

func opName(op opKind) string {
	if op == opRead {
		return "read"
	}
	return "write"
}
