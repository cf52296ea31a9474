package raid10

import (
	"sync/atomic"
)

// Hand-offs: the preallocated request (wreq) and the long-lived workers that
// run the member calls handed to them (a write's second copy, a call under
// the member deadline, a part of a large read).

// opKind is what a handed-off request does.
type opKind uint8

const (
	opWrite opKind = iota
	opDiscard
	opZeroes
	opRead      // handed-off reads only (deadline.go)
	opReadPiece // one part of a large read (readlarge.go)
)

// wreq is the preallocated request that hands one copy of a write
// to a worker, so both copies are written concurrently without a goroutine
// or an allocation per request.
type wreq struct {
	s      *slot
	ref    *memberRef
	op     opKind
	p      []byte
	off    int64
	length int64
	fua    bool
	err    error
	done   chan struct{}
	want   int8         // opReadPiece: the copy to read (copyAny, 0, 1)
	raw    bool         // opReadPiece: a copy's own read (no hydrate hook, reserved tail)
	idx    uint32       // position in reqList
	buf    *[]byte      // the call's bounce buffer (submit, worker), owned by the worker
	state  atomic.Int32 // reqPending, reqDone, reqAbandoned
}

// submit hands req to a worker of its own: it claims a spare worker (one
// waiting for a request that no other submitter has claimed) or starts one
// more. So a request never queues behind busy workers, whatever they wait
// for: a part of a large read may wait on a worker for a barrier whose
// raiser waits for a member call it handed off (readlarge.go); that call
// has its own worker. The workers never outnumber the preallocated
// requests: a busy worker holds one, and a worker starts only for a request
// no spare one can take. Workers stay for the array's life.
func (a *Array) submit(req *wreq) {
	if req.op == opWrite && len(req.p) > 0 {
		// The worker writes from a buffer of its own: if the call is
		// abandoned (deadline.go), the caller reuses its buffer at once.
		b := getBounce(len(req.p))
		copy(*b, req.p)
		req.buf, req.p = b, (*b)[:len(req.p)]
	}
	for {
		n := a.spare.Load()
		if n <= 0 {
			a.nWorkers.Add(1)
			a.workers.Add(1)
			go a.worker(true)
			break
		}
		if a.spare.CompareAndSwap(n, n-1) {
			break
		}
	}
	a.work <- req
}

// worker runs handed-off requests. A worker counts itself spare before it
// waits for a request, unless a submitter started it for its own (claimed):
// then the spare workers plus the started ones are never fewer than the
// requests queued.
func (a *Array) worker(claimed bool) {
	defer a.workers.Done()
	for {
		if !claimed {
			a.spare.Add(1)
		}
		claimed = false
		r, ok := <-a.work
		if !ok {
			return
		}
		switch r.op {
		case opReadPiece:
			r.err = a.readPiece(r.p, r.off, int(r.want), r.raw)
		case opRead:
			r.buf = getBounce(len(r.p))
			r.err = a.memberRead(r.s, r.ref, (*r.buf)[:len(r.p)], r.off)
		default:
			r.err = a.memberWrite(r.s, r.ref, r.op, r.p, r.off, r.length, r.fua)
		}
		a.complete(r)
	}
}
