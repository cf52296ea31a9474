package nbd

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
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

	c      *conn         // its connection, for a queued request's completion (conn_queue.go)
	queued bool          // it went through the queue
	state  atomic.Uint32 // slotIdle, slotQueued, ... and slotFenced (fence.go)
	since  atomic.Int64  // start of a modifying request, for the guard (fence.go); 0 for others
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
	// The workers start on demand (dispatch), at most Options.Workers: a node serves
	// hundreds of devices, most of them idle, and 32 waiting goroutines per connection
	// were 64 per volume. spare is the workers waiting for a request less the requests
	// handed over that no waiting worker has taken yet (negative: requests queue).
	workers  sync.WaitGroup
	nWorkers atomic.Int32
	spare    atomic.Int32
	// q is the backend's asynchronous queue (conn_queue.go), nil without one. The reader
	// role owns its submission side.
	q blockdev.AsyncQueue

	// Replies are written by whoever executed the request, under wmu. waiting counts the
	// goroutines about to take wmu: the last writer of a burst (waiting == 0) flushes, so
	// replies are batched into few writes without a reply ever waiting for a slow request.
	wmu     sync.Mutex
	bw      *replyWriter
	werr    error
	waiting atomic.Int32
	// held is set when a reply was queued without a flush because the reader had more requests
	// buffered to execute inline (a burst): the reader flushes before it waits on the socket.
	held         atomic.Bool
	beforeWaitFn func() // c.beforeWait, bound once (a method value per request would allocate)
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
	c.beforeWaitFn = c.beforeWait
	c.free = make(chan *request, o.MaxInflight)
	c.work = make(chan *request, o.MaxInflight)
	c.ended = make(chan struct{})
	for i := range c.slots {
		c.slots[i].c = c
		c.free <- &c.slots[i]
	}
	c.openQueue()

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
		if dropped, orphaned, running := c.end(); dropped+orphaned > 0 {
			klog.InfoS("NBD client gone, its requests left unanswered", "export", c.exp.Name,
				"dropped", dropped, "stillRunning", orphaned, "running", running, "err", rerr)
		}
	}
	close(c.work)
	finish := func() error {
		c.workers.Wait()
		c.readers.Wait()
		c.closeQueue()
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

// zeroPage is written by writeZeroes. It is never written to, so it is shared by every
// worker, and it is not taken from the pool: a worker waiting for the pool could deadlock
// with the requests queued behind it that hold the pool's buffers.
var zeroPage = make([]byte, zeroChunk)

// dispatch hands r to a worker: a waiting one takes it, or one more starts for it while
// fewer than Options.Workers run; at that bound r waits for the first worker done. Only the
// reader role dispatches, and only before the reader ends (transmit closes work after).
func (c *conn) dispatch(r *request) {
	if c.spare.Add(-1) < 0 && c.nWorkers.Load() < int32(c.srv.opts.Workers) {
		c.nWorkers.Add(1)
		c.workers.Add(1)
		go c.worker()
	}
	c.work <- r
}

// worker runs handed-over requests until work closes. It counts itself spare before each
// wait, which balances the dispatch of the request it then takes.
func (c *conn) worker() {
	defer c.workers.Done()
	for {
		c.spare.Add(1)
		r, ok := <-c.work
		if !ok {
			return
		}
		c.run(r)
	}
}
