package nbd

// Executing a request and replying: the workers' (and an inline reader's) side of a
// connection, and recycling its slot.

import (
	"encoding/binary"
	"errors"
	"io"
	"time"
)

// run executes r and replies, unless the connection ended first: a request dropped before
// it started is recycled unanswered; one orphaned meanwhile finishes (or, if it was still
// waiting in the fence, never runs) unanswered. A modifying request first waits in the
// fence while a fenced request that arrived before it overlaps it (fence.go). The healthy
// path costs three compare-and-swaps and one load.
func (c *conn) run(r *request) { c.runHold(r, false) }

// runHold is run; hold queues the reply without flushing it (conn.inline).
func (c *conn) runHold(r *request, hold bool) {
	if ok, _ := r.move(slotQueued, slotWaiting); !ok {
		c.recycle(r) // dropped, and out of the fence (conn.end)
		return
	}
	f := &c.exp.fence
	if f.n.Load() != 0 && r.modifies() {
		f.wait(r)
	}
	if ok, _ := r.move(slotWaiting, slotRunning); ok {
		if r.cmd == CmdRead || r.cmd == CmdWrite && r.flags&CmdFlagFUA == 0 {
			t0 := time.Since(epoch)
			c.execute(r)
			old := c.execNs.Load()
			c.execNs.Store(old + (int64(time.Since(epoch)-t0)-old)/8)
		} else {
			c.execute(r)
		}
	}
	ok, fenced := r.move(slotRunning, slotIdle)
	if fenced {
		f.release(r)
	}
	if !ok {
		c.recycle(r) // orphaned
		return
	}
	c.replyHold(r, hold)
}

// recycle returns r's slot and buffer without a reply.
func (c *conn) recycle(r *request) {
	c.srv.pool.Put(r.buf)
	r.buf = nil
	r.state.Store(slotIdle)
	c.free <- r
}

// execute runs one request against the backend and sets r.errno.
func (c *conn) execute(r *request) {
	x := c.exp
	inRange := r.within(x.size())
	fua := r.flags&CmdFlagFUA != 0
	switch r.cmd {
	case CmdRead:
		if !inRange {
			r.errno = ErrnoInval
			return
		}
		n, err := x.Backend.ReadAt(r.buf, int64(r.off))
		if err != nil && (!errors.Is(err, io.EOF) || n != len(r.buf)) {
			r.errno = errnoOf(err)
		}
	case CmdWrite:
		switch {
		case x.ReadOnly:
			r.errno = ErrnoPerm
		case !inRange:
			r.errno = ErrnoNoSpc
		case fua && x.fua != nil:
			_, err := x.fua.WriteAtFUA(r.buf, int64(r.off))
			r.errno = errnoOf(err)
		default:
			_, err := x.Backend.WriteAt(r.buf, int64(r.off))
			if err == nil && fua {
				err = x.Backend.Flush()
			}
			r.errno = errnoOf(err)
		}
	case CmdFlush:
		r.errno = errnoOf(x.Backend.Flush())
	case CmdTrim:
		switch {
		case x.ReadOnly:
			r.errno = ErrnoPerm
		case !inRange:
			r.errno = ErrnoInval
		default:
			var err error
			if x.disc != nil {
				err = x.disc.Discard(int64(r.off), int64(r.length))
			}
			if err == nil && fua {
				err = x.Backend.Flush()
			}
			r.errno = errnoOf(err)
		}
	case CmdWriteZeroes:
		switch {
		case x.ReadOnly:
			r.errno = ErrnoPerm
		case !inRange:
			r.errno = ErrnoNoSpc
		default:
			var err error
			if x.zero != nil {
				err = x.zero.WriteZeroes(int64(r.off), int64(r.length))
			} else {
				err = c.writeZeroes(int64(r.off), int64(r.length))
			}
			if err == nil && fua {
				err = x.Backend.Flush()
			}
			r.errno = errnoOf(err)
		}
	default:
		r.errno = ErrnoInval
	}
}

// within reports whether r's range lies inside a device of size bytes (and does not wrap).
func (r *request) within(size int64) bool {
	end := r.off + uint64(r.length)
	return end >= r.off && end <= uint64(size)
}

// writeZeroes zeroes a range of a backend that is no blockdev.ZeroWriter.
func (c *conn) writeZeroes(off, length int64) error {
	for length > 0 {
		n := min(length, zeroChunk)
		if _, err := c.exp.Backend.WriteAt(zeroPage[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// reply sends r's reply and recycles its slot and buffer. After a write error it closes the
// connection (which stops the reader) and only recycles.
func (c *conn) reply(r *request) { c.replyHold(r, false) }

// replyHold is reply; hold leaves the reply queued for the reader's next flush (conn.held),
// unless the batch fills up.
func (c *conn) replyHold(r *request, hold bool) {
	c.waiting.Add(1)
	c.wmu.Lock()
	c.waiting.Add(-1)
	c.stats.record(r)
	if c.werr == nil {
		h := &c.hdr
		binary.BigEndian.PutUint32(h[0:], magicReply)
		binary.BigEndian.PutUint32(h[4:], uint32(r.errno))
		binary.BigEndian.PutUint64(h[8:], r.handle)
		var payload []byte
		if r.cmd == CmdRead && r.errno == ErrnoNone {
			payload = r.buf
		}
		c.werr = c.bw.write(h[:], payload)
		switch {
		case c.werr != nil:
		case hold:
			c.held.Store(true)
		case c.waiting.Load() == 0:
			c.werr = c.bw.flush()
		}
		if c.werr != nil {
			_ = c.nc.Close()
		}
	}
	c.wmu.Unlock()
	c.srv.pool.Put(r.buf)
	r.buf = nil
	c.free <- r
}
