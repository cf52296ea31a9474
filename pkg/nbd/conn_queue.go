package nbd

// The asynchronous path of a connection: where the export's backend is a
// blockdev.AsyncBackend, the reader submits reads and plain writes to the connection's queue
// and goes on reading; the queue's completion (request.Complete) replies. Nothing changes
// for the client: the slot moves, the fence and the orphan rules are those of conn.run.

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// openQueue gives the connection an asynchronous queue of MaxInflight requests when the
// backend has them and the options allow it; without one the connection serves every request
// on the workers (and inline), as before.
func (c *conn) openQueue() {
	ab, ok := c.exp.Backend.(blockdev.AsyncBackend)
	if !ok || c.srv.opts.SyncOnly {
		return
	}
	q, err := ab.NewAsyncQueue(c.srv.opts.MaxInflight, c.flushHeld)
	if err != nil {
		klog.InfoS("NBD connection serves through the blocking calls: no asynchronous queue", "export", c.exp.Name, "err", err)
		return
	}
	c.q = q
}

// closeQueue waits for the requests in the queue to complete (and reply), then releases it.
// The last reader has ended: nothing submits any more.
func (c *conn) closeQueue() {
	if c.q == nil {
		return
	}
	if err := c.q.Close(); err != nil {
		klog.ErrorS(err, "Closing an NBD connection's queue", "export", c.exp.Name)
	}
}

// submitQueued hands what the reader queued to the kernel; the reader calls it before it
// waits for anything (the socket, a slot, a buffer) and before it runs a request itself.
func (c *conn) submitQueued() {
	if c.q == nil {
		return
	}
	if err := c.q.Submit(); err != nil {
		klog.ErrorS(err, "Submitting NBD requests to the queue", "export", c.exp.Name)
	}
}

// queued submits r to the queue and reports whether it did: a read, or a write without FUA,
// in range and on a writable export, while no fenced write could order it (the workers wait in
// the fence; a queued request never waits). Anything else, and every error reply, takes the
// workers.
func (c *conn) queued(r *request) bool {
	x := c.exp
	if c.q == nil || r.errno != ErrnoNone {
		return false
	}
	switch {
	case r.cmd == CmdRead:
	case r.cmd == CmdWrite && r.flags&CmdFlagFUA == 0 && !x.ReadOnly:
		if x.fence.n.Load() != 0 {
			return false
		}
	default:
		return false
	}
	if !r.within(x.size()) {
		return false
	}
	if ok, _ := r.move(slotQueued, slotWaiting); !ok {
		c.recycle(r) // dropped, and out of the fence (conn.end)
		return true
	}
	if ok, _ := r.move(slotWaiting, slotRunning); !ok {
		r.Complete(nil) // orphaned meanwhile: Complete recycles it unanswered
		return true
	}
	r.queued = true
	if r.cmd == CmdRead {
		c.q.Read(r.buf, int64(r.off), r)
	} else {
		c.q.Write(r.buf, int64(r.off), false, r)
	}
	return true
}

// Complete implements blockdev.Completer: the end of a queued request, as in conn.runHold.
func (r *request) Complete(err error) {
	c := r.c
	r.errno = errnoOf(err)
	ok, fenced := r.move(slotRunning, slotIdle)
	if fenced {
		c.exp.fence.release(r)
	}
	if !ok {
		c.recycle(r) // orphaned
		return
	}
	// Held: the queue flushes once it has delivered the completions at hand (its idle call,
	// conn.flushHeld), so a batch of replies leaves in one write.
	c.replyHold(r, true)
}
