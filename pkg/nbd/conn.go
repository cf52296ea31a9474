package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

const (
	readBufferSize  = 128 << 10
	writeBufferSize = 256 << 10
	zeroChunk       = 64 << 10

	// fastExec is the execution time (moving average of reads and plain writes) under which a
	// backend counts as memory-speed: the reader then executes every read and plain write it
	// decodes itself, a burst of them in a row, instead of handing each to a worker (conn.inline).
	// A worker's wake-up costs more than such a request, and the CPUs, not the backend, bound
	// the throughput. A device with latency (a disk, the engine over disks, whose member calls
	// take tens of microseconds) stays above it, and its requests run in parallel on workers.
	fastExec = 10 * time.Microsecond

	// hangupCheck is how often a reader that waits for a free slot (every request of its
	// connection in flight: a stuck backend) checks that the peer is still there, so that a
	// connection the kernel gave up on ends, and fences its orphans, while its requests are
	// still stuck.
	hangupCheck = 5 * time.Millisecond
)

var (
	// errDrained ends the transmission phase of a connection that Shutdown drains.
	errDrained = errors.New("nbd: connection drained")
	// errTakenOver ends a reader whose role another goroutine took while it executed a
	// request inline.
	errTakenOver = errors.New("nbd: reader role taken over")
	// errHungUp ends a reader that found its peer gone while it waited for a slot or a
	// buffer: what it has read since is stale and never runs.
	errHungUp = errors.New("nbd: peer hung up")
)

// request is one slot of a connection's in-flight table. Slots are allocated once per
// connection and recycled through conn.free.
type request struct {
	handle uint64
	off    uint64
	length uint32
	cmd    Command
	flags  CommandFlags
	buf    []byte // payload of a WRITE, data of a READ; from the server's pool
	errno  Errno
	start  time.Duration // when it was decoded, since epoch (stats.go)

	state atomic.Uint32 // slotIdle, slotQueued, ... and slotFenced (fence.go)
	since atomic.Int64  // start of a modifying request, for the guard (fence.go); 0 for others
}

// conn is one client connection (or one socket of the kernel attach).
type conn struct {
	srv *Server
	nc  net.Conn
	raw syscall.RawConn // nc's socket, to look for a hang-up; nil if nc has none
	exp *export
	br  *bufio.Reader

	slots []request // the in-flight table, allocated once

	free chan *request // idle slots: the reader blocks here at MaxInflight
	work chan *request // read requests, to the workers

	// Replies are written by whoever executed the request, under wmu. waiting counts the
	// goroutines about to take wmu: the last writer of a burst (waiting == 0) flushes, so
	// replies are batched into few writes without a reply ever waiting for a slow request.
	wmu     sync.Mutex
	bw      *replyWriter
	werr    error
	waiting atomic.Int32
	// held is set when a reply was queued without a flush because the reader had more requests
	// buffered to execute inline (a burst): the reader flushes before it waits on the socket.
	held        atomic.Bool
	flushHeldFn func() // c.flushHeld, bound once (a method value per request would allocate)
	// execNs is the moving average of the execution time of reads and plain writes, in ns (a
	// hint: racy updates may be lost); see fastExec.
	execNs atomic.Int64
	// inlined counts the requests the reader executed itself.
	inlined atomic.Uint64
	hdr     [replyHeaderSize]byte // under wmu; a field so that it is not allocated per reply
	stats   Stats                 // under wmu
	counted *export               // the export stats count for: set under Server.mu as transmit starts

	draining atomic.Bool

	// The handover (handover.go): kernel marks a connection of the kernel attach, handing
	// makes its reader stop at the next request boundary, unread keeps the bytes of a
	// request the reader had begun to read when it stopped, and keep leaves the socket open
	// at release.
	kernel  bool
	handing atomic.Bool
	unread  []byte
	keep    bool

	// The reader role. One goroutine at a time reads requests. A request that is alone on
	// the connection it executes itself (conn.inline: a hand-off to a worker costs a wake-up,
	// which doubles the latency at queue depth 1), after marking the role free to take. If the
	// request is still running a tick or two later, the server's watchdog (watchdog.go) starts
	// a new reader, so that a slow request (a hung disk, a read retried on the other copy)
	// never holds up the requests sent behind it; the old reader replies and ends.
	//
	// role is even while the reader reads and odd while it executes inline. The reader
	// that loaded v (even) stores v+1 and, when done, swaps v+1 for v+2. The watchdog takes
	// the role by swapping v+1 for v+3 (taking), counting the new reader in readers, then
	// storing v+4; the old reader's swap fails, and it ends only once it sees v+4, so the
	// count never drops to zero while a new reader is being added. Values only grow.
	role    atomic.Uint64
	watched uint64         // role as the watchdog saw it at its last tick; the watchdog's own
	readers sync.WaitGroup // the readers that have not ended yet
	rerr    error          // why the last reader ended; read after ended is closed
	ended   chan struct{}  // closed by the last reader (the one not taken over) as it ends
}

// drain makes the reader stop at the next request; what is in flight completes.
func (c *conn) drain() {
	c.draining.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// transmit runs the transmission phase until the client disconnects, the connection breaks
// or the server drains it, then releases the connection. Every request read is replied to
// before transmit returns, unless the socket failed or the peer is gone: then the requests
// not started are dropped, and transmit returns without waiting for those still in the
// backend (orphans, fence.go), which finish in the background before the connection is
// released (Shutdown waits for them).
func (c *conn) transmit() error {
	o := &c.srv.opts
	c.srv.mu.Lock()
	c.counted = c.exp
	c.slots = make([]request, o.MaxInflight)
	c.srv.mu.Unlock()
	if c.br == nil {
		c.br = bufio.NewReaderSize(c.nc, readBufferSize)
	}
	if sc, ok := c.nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	c.bw = newReplyWriter(c.nc, writeBufferSize)
	c.flushHeldFn = c.flushHeld
	c.free = make(chan *request, o.MaxInflight)
	c.work = make(chan *request, o.MaxInflight)
	c.ended = make(chan struct{})
	for i := range c.slots {
		c.free <- &c.slots[i]
	}
	var workers sync.WaitGroup
	for range o.Workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for r := range c.work {
				c.run(r)
			}
		}()
	}

	// The reader runs in its own goroutine, so that this one can end the connection even
	// while a reader the watchdog replaced still executes a stuck request.
	c.readers.Add(1)
	go c.read()
	<-c.ended
	rerr := c.rerr
	gone := c.peerGone(rerr)
	if !gone && errors.Is(rerr, errHandedOver) {
		c.keep = true // release leaves the socket open: HandOver passes it on (handover.go)
	}
	if gone {
		_ = c.nc.Close()
		if dropped, orphaned := c.end(); dropped+orphaned > 0 {
			klog.InfoS("NBD client gone, its requests left unanswered", "export", c.exp.Name,
				"dropped", dropped, "stillRunning", orphaned, "err", rerr)
		}
	}
	close(c.work)
	finish := func() error {
		workers.Wait()
		c.readers.Wait()
		c.wmu.Lock()
		if c.werr == nil {
			c.werr = c.bw.flush()
		}
		werr := c.werr
		c.wmu.Unlock()
		c.srv.release(c)
		return werr
	}
	if gone {
		go finish() //nolint:errcheck // nobody is left to hear about a write error
		return rerr
	}
	werr := finish()
	if rerr == nil || isClosed(rerr) && werr != nil {
		return werr
	}
	return rerr
}

// read runs the reader role until the connection ends or another reader takes the role over.
func (c *conn) read() {
	defer c.readers.Done()
	err := c.readRequests()
	if errors.Is(err, errTakenOver) {
		return
	}
	c.rerr = err
	close(c.ended)
}

// peerGone reports whether the peer of a connection whose last reader ended with err can no
// longer take replies: it closed the socket or shut down both directions (what the kernel's
// nbd driver does to a socket after a request timeout), or the socket failed. After
// NBD_CMD_DISC, a drain, a protocol error or a half-close the peer still reads, and gets
// the replies of everything it sent.
func (c *conn) peerGone(err error) bool {
	switch {
	case err == nil, errors.Is(err, errDrained):
		return false
	case errors.Is(err, errHungUp):
		return true
	case c.raw == nil:
		return isClosed(err)
	}
	return c.hungUp()
}

// hungUp asks the socket (poll, without waiting) whether the peer is gone. A closed socket
// counts as gone.
func (c *conn) hungUp() bool {
	if c.raw == nil {
		return false
	}
	hup := false
	err := c.raw.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd)}} // POLLHUP and POLLERR are always reported
		for {
			n, err := unix.Poll(p, 0)
			if err == unix.EINTR {
				continue
			}
			hup = err == nil && n > 0 && p[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
			return
		}
	})
	return err != nil || hup
}

// slot takes a free request slot. When every slot is in flight it waits, and looks for a
// hang-up every hangupCheck: a reader blocked here sees no end of file. waited reports
// that it had to wait.
func (c *conn) slot() (r *request, waited bool, err error) {
	select {
	case r = <-c.free:
		return r, false, nil
	default:
	}
	c.flushHeld() // the replies a burst held back must not wait for a free slot
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
			c.flushHeld() // the burst is over: this read may wait
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
			r.buf, bufWaited = c.srv.pool.get(int(r.length), c.flushHeldFn)
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
		if inline, hold := c.inline(r); inline {
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
		c.work <- r
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
	end := r.off + uint64(r.length)
	inRange := end >= r.off && end <= uint64(x.size())
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

// zeroPage is written by writeZeroes. It is never written to, so it is shared by every
// worker, and it is not taken from the pool: a worker waiting for the pool could deadlock
// with the requests queued behind it that hold the pool's buffers.
var zeroPage = make([]byte, zeroChunk)

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
