package nbd

// The reader's side of a connection: taking a free slot, decoding requests into it, and
// choosing between executing a request inline (a memory-speed backend) and handing it to a
// worker.

import (
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"time"
)

// slot takes a free request slot. When every slot is in flight it waits, and looks for a
// hang-up every hangupCheck: a reader blocked here sees no end of file. waited reports
// that it had to wait.
func (c *conn) slot() (r *request, waited bool, err error) {
	select {
	case r = <-c.free:
		return r, false, nil
	default:
	}
	c.beforeWait()
	t := time.NewTicker(hangupCheck)
	defer t.Stop()
	for {
		select {
		case r = <-c.free:
			return r, true, nil
		case <-t.C:
			if c.hungUp() {
				return nil, true, errHungUp
			}
		}
	}
}

// takeOver passes the role to a new reader if the reader is still executing inline the
// request it started when role was inline (odd).
func (c *conn) takeOver(inline uint64) {
	if !c.role.CompareAndSwap(inline, inline+2) { // taking: the old reader waits for the store below
		return
	}
	c.srv.takeovers.Add(1)
	// A request ran inline past a tick: the backend is not memory-speed now, whatever its
	// average said (a stuck call has not counted yet). Its requests go to the workers again.
	c.execNs.Store(int64(watchTick))
	c.readers.Add(1) // the old reader has not ended (it waits): the count is positive
	c.role.Store(inline + 3)
	go c.read()
}

// inline reports whether the reader executes r itself, and hold whether its reply waits for
// the next flush (more requests are buffered, which the reader executes next: the burst's
// replies leave in one write). r must be a read or a plain write, which are short unless
// something is wrong, and either the connection's only request (nothing more buffered, every
// other slot free: the queue-depth-1 case, where handing it to a worker would double its
// latency) or the backend memory-speed (fastExec). Otherwise, with other requests in flight,
// the workers keep them in parallel (a disk serves a deep queue faster); flushes, FUA
// writes, trims and zeroes always go to them.
func (c *conn) inline(r *request) (inline, hold bool) {
	if r.errno != ErrnoNone || r.cmd != CmdRead && (r.cmd != CmdWrite || r.flags&CmdFlagFUA != 0) {
		return false, false
	}
	more := c.br.Buffered() > 0
	if !more && len(c.free) == cap(c.free)-1 {
		return true, false
	}
	if c.execNs.Load() < int64(c.srv.opts.fastExec) {
		return true, more
	}
	return false, false
}

// beforeWait is what the reader does before it may wait: submit what it queued, and write the
// replies a burst held back; neither may wait for what the reader waits for.
func (c *conn) beforeWait() {
	c.submitQueued()
	c.flushHeld()
}

// flushHeld writes the replies a burst held back (conn.held).
func (c *conn) flushHeld() {
	if !c.held.Swap(false) {
		return
	}
	c.wmu.Lock()
	if c.werr == nil {
		if c.werr = c.bw.flush(); c.werr != nil {
			_ = c.nc.Close()
		}
	}
	c.wmu.Unlock()
}

// readRequests decodes requests and hands them to the workers, or executes a lone request
// itself (see conn.inline and conn.role). It returns nil on NBD_CMD_DISC, errTakenOver when another
// reader took the role while this one executed a request.
func (c *conn) readRequests() error {
	o := &c.srv.opts
	var h [requestHeaderSize]byte
	for {
		if c.handing.Load() {
			return errHandedOver
		}
		if c.br.Buffered() < requestHeaderSize {
			c.beforeWait() // the burst is over: this read may wait
		}
		if n, err := io.ReadFull(c.br, h[:]); err != nil {
			if c.handing.Load() {
				c.unread = append(c.unread[:0], h[:n]...)
				return errHandedOver
			}
			if c.draining.Load() {
				return errDrained
			}
			return err
		}
		if m := binary.BigEndian.Uint32(h[0:]); m != magicRequest {
			return fmt.Errorf("%w: bad request magic %#x", ErrProtocol, m)
		}
		r, waited, err := c.slot()
		if err != nil {
			return err
		}
		r.flags = CommandFlags(binary.BigEndian.Uint16(h[4:]))
		r.cmd = Command(binary.BigEndian.Uint16(h[6:]))
		r.handle = binary.BigEndian.Uint64(h[8:])
		r.off = binary.BigEndian.Uint64(h[16:])
		r.length = binary.BigEndian.Uint32(h[24:])
		r.errno = ErrnoNone
		r.buf = nil
		r.queued = false
		r.start = time.Since(epoch)
		switch r.cmd {
		case CmdDisc:
			c.free <- r
			return nil
		case CmdRead, CmdWrite:
			if int64(r.length) > int64(o.MaxRequestSize) {
				r.errno = ErrnoInval
				if r.cmd == CmdWrite {
					if err := c.skip(int64(r.length)); err != nil {
						c.free <- r
						return err
					}
				}
				c.reply(r)
				continue
			}
			var bufWaited bool
			r.buf, bufWaited = c.srv.pool.get(int(r.length), c.beforeWaitFn)
			if r.buf == nil {
				c.free <- r
				return ErrServerClosed
			}
			waited = waited || bufWaited
			if r.cmd == CmdWrite {
				if n, err := io.ReadFull(c.br, r.buf); err != nil {
					if c.handing.Load() {
						c.unread = append(append(c.unread[:0], h[:]...), r.buf[:n]...)
					}
					c.srv.pool.Put(r.buf)
					r.buf = nil
					c.free <- r
					if c.handing.Load() {
						return errHandedOver
					}
					if c.draining.Load() {
						return errDrained
					}
					return err
				}
			}
		}
		// After a wait for a slot or a buffer, what was read may have sat in the socket
		// while the kernel gave up on it and re-sent it elsewhere: it must not run then.
		if waited && c.hungUp() {
			c.recycle(r)
			return errHungUp
		}
		if r.modifies() {
			r.since.Store(int64(r.start))
			c.srv.guard()
		} else {
			r.since.Store(0)
		}
		r.state.Store(slotQueued)
		inline, hold := c.inline(r)
		if !inline && c.queued(r) {
			continue
		}
		if inline {
			c.submitQueued() // nothing queued waits for a request run here
			v := c.role.Load()
			c.role.Store(v + 1)
			c.srv.watch()
			c.inlined.Add(1)
			c.runHold(r, hold)
			if !c.role.CompareAndSwap(v+1, v+2) {
				for c.role.Load() == v+3 { // the watchdog is adding the new reader
					runtime.Gosched()
				}
				c.flushHeld() // the new reader may be waiting on the socket already
				return errTakenOver
			}
			continue
		}
		c.dispatch(r)
	}
}

// skip reads and drops n bytes of payload with a fixed buffer.
func (c *conn) skip(n int64) error {
	for n > 0 {
		k, err := c.br.Discard(int(min(n, 1<<30)))
		n -= int64(k)
		if err != nil {
			return err
		}
	}
	return nil
}
