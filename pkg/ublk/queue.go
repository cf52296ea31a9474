package ublk

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// wakeTag is the user data of the eventfd read that wakes a queue thread; request tags are
// below 4096.
const wakeTag = 1 << 32

// queue is one hardware queue of a device: a thread (the kernel binds the queue to the task
// that fetched its requests, and takes commits only from it) that owns a ring, fetches
// requests, hands each to a goroutine that calls the backend, and commits the results.
type queue struct {
	d     *Device
	id    int
	depth int
	maxIO int

	ring  *uring.Ring
	descs []byte // the kernel's io descriptors of this queue, read-only
	bufs  []byte // depth buffers of maxIO bytes, anonymous memory

	tid     int // the queue thread's id, once it runs
	wakeFd  int
	wakeBuf [8]byte // target of the armed eventfd read

	// aq is the backend's asynchronous queue (blockdev.AsyncBackend), owned by this thread:
	// reads and plain writes go to it, and its completions (tagDone) hand the result back
	// as a goroutine's would. nil without one.
	aq    blockdev.AsyncQueue
	dones []tagDone
	// rq is aq when it runs on this thread's ring (ring.go); owned holds the results it ended
	// there, committed before the thread next waits (thread-owned, no lock).
	rq    blockdev.RingQueue
	owned []completion
	// zc is the zero-copy state (zerocopy.go) when the device has automatic buffer
	// registration; nil otherwise.
	zc *zeroCopy

	mu       sync.Mutex
	done     []completion // results to commit, filled by the request goroutines
	sleeping atomic.Bool  // the thread is (about to be) waiting in io_uring_enter
	stop     atomic.Bool
	serving  sync.WaitGroup

	stats struct {
		reads, writes, flushes, discards, errors atomic.Uint64
		bytesRead, bytesWritten                  atomic.Uint64
		onRing                                   atomic.Uint64 // ended on the thread's ring
		zeroCopied, copied                       atomic.Uint64 // zerocopy.go
	}
}

type completion struct {
	tag uint16
	res int32
}

func newQueue(d *Device, id int) *queue {
	return &queue{d: d, id: id, depth: int(d.info.QueueDepth), maxIO: int(d.info.MaxIOBufBytes), wakeFd: -1}
}

// descArea is the byte offset of queue q's descriptors in /dev/ublkcN.
func descArea(q int) int64 {
	return int64(q) * int64(roundUp(maxQueueDepth*ioDescSize, pageSize))
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

func pow2(n int) uint32 {
	p := uint32(1)
	for int(p) < n {
		p <<= 1
	}
	return p
}

// run is the queue thread. It reports on ready once every tag is fetched (or why not), then
// serves until the kernel aborts every tag (STOP_DEV) or requestStop.
func (q *queue) run(ready chan<- error) {
	runOffMainThread(func() { q.runLocked(ready) })
}

// runLocked is run's body, on the queue's own thread.
func (q *queue) runLocked(ready chan<- error) {
	q.tid = unix.Gettid()
	if err := q.setup(); err != nil {
		q.teardown()
		ready <- err
		return
	}
	ready <- nil
	if err := q.loop(); err != nil {
		klog.ErrorS(err, "ublk queue stopped", "device", q.d.id, "queue", q.id)
	}
	q.teardown()
}

// runOffMainThread runs f locked to an OS thread other than the process's main thread, and
// never unlocked: the runtime ends a locked thread when its goroutine ends, which the
// kernel's recovery needs (it takes over a queue only once the old server thread is
// exiting), except the main thread, which it keeps. A goroutine that finds itself on the
// main thread keeps it locked (nothing else can run there then) while f runs on a new
// goroutine, which the scheduler must give another thread. Trying to move off it (unlock,
// sleep, lock again) was not enough: a queue thread stayed on the main thread after 100
// tries and its recovery in the same process made the kernel warn (TestUblkVM in a CI run).
func runOffMainThread(f func()) {
	runtime.LockOSThread()
	if unix.Gettid() != unix.Getpid() {
		f()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		f()
	}()
	<-done
	runtime.UnlockOSThread()
}

func (q *queue) setup() error {
	var err error
	// SQ: every tag's command plus the wake read, and the member I/O on a ring queue.
	// COOP_TASKRUN: the kernel runs completion work when this thread enters the ring anyway,
	// without interrupting it.
	n := q.ringEntries()
	if q.ring, err = uring.New(n, uring.SetupCoopTaskrun|uring.SetupSingleIssuer); errors.Is(err, unix.EINVAL) {
		q.ring, err = uring.New(n, 0)
	}
	if err != nil {
		return err
	}
	descLen := roundUp(q.depth*ioDescSize, pageSize)
	if q.descs, err = unix.Mmap(int(q.d.char.Fd()), descArea(q.id), descLen, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("ublk: mmap descriptors of queue %d: %w", q.id, err)
	}
	if q.d.ZeroCopy() {
		if err := q.setupZeroCopy(); err != nil {
			return err
		}
	} else if q.bufs, err = unix.Mmap(-1, 0, q.depth*q.maxIO, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		return fmt.Errorf("ublk: buffers of queue %d (%d bytes): %w", q.id, q.depth*q.maxIO, err)
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("ublk: eventfd: %w", err)
	}
	q.mu.Lock()
	q.wakeFd = fd
	q.mu.Unlock()
	q.openAsync()
	for tag := 0; tag < q.depth; tag++ {
		if err := q.prepCmd(ioFetchReq, uint16(tag), 0); err != nil {
			return err
		}
	}
	if err := q.armWake(); err != nil {
		return err
	}
	if _, err := q.ring.Submit(); err != nil {
		return fmt.Errorf("ublk: fetch requests of queue %d: %w", q.id, err)
	}
	// A refused fetch completes at once; look before saying ready.
	if c, ok := q.ring.PeekCQE(); ok && c.Res < 0 && c.UserData != wakeTag {
		return fmt.Errorf("ublk: fetch request %d of queue %d: %w", c.UserData, q.id, c.Err())
	}
	return nil
}

func (q *queue) teardown() {
	if q.aq != nil {
		if err := q.aq.Close(); err != nil { // its requests write into bufs
			klog.ErrorS(err, "ublk: closing the queue's asynchronous queue", "device", q.d.id, "queue", q.id)
		}
	}
	if q.rq != nil {
		q.ring = nil // the ring queue's Close closed it
	}
	q.endWaiting()
	q.serving.Wait() // request goroutines write into bufs
	if q.ring != nil {
		_ = q.ring.Close()
	}
	if q.descs != nil {
		_ = unix.Munmap(q.descs)
	}
	if q.bufs != nil {
		_ = unix.Munmap(q.bufs)
	}
	q.teardownZeroCopy()
	q.mu.Lock()
	if q.wakeFd >= 0 {
		_ = unix.Close(q.wakeFd)
		q.wakeFd = -1
	}
	q.mu.Unlock()
}

func (q *queue) buf(tag uint16) []byte {
	return q.bufs[int(tag)*q.maxIO : (int(tag)+1)*q.maxIO]
}

// prepCmd queues a FETCH_REQ or COMMIT_AND_FETCH_REQ for tag, submitting what is queued
// first if the ring is full.
func (q *queue) prepCmd(op uint32, tag uint16, res int32) error {
	sqe, err := q.getSQE()
	if err != nil {
		return err
	}
	sqe.PrepURingCmd(int(q.d.char.Fd()), op)
	sqe.UserData = uint64(tag)
	c := ioCmd{qID: uint16(q.id), tag: tag, result: res, addr: uint64(uintptr(unsafe.Pointer(&q.buf(tag)[0])))}
	if q.zc != nil { // the slot goes in the SQE's own addr; the command's must be 0
		c.addr, sqe.Addr = 0, autoBufReg(tag)
	}
	copy(q.ring.Cmd(sqe), c.bytes())
	return nil
}

// getSQE returns a submission slot, submitting what is prepared first if the ring is full
// (the member I/O of a ring queue shares it).
func (q *queue) getSQE() (*uring.SQE, error) {
	sqe, err := q.ring.GetSQE()
	if errors.Is(err, uring.ErrSQFull) {
		if _, err = q.ring.Submit(); err != nil {
			return nil, err
		}
		sqe, err = q.ring.GetSQE()
	}
	return sqe, err
}

func (q *queue) armWake() error {
	sqe, err := q.getSQE()
	if err != nil {
		return err
	}
	sqe.PrepRead(q.wakeFd, q.wakeBuf[:], 0)
	sqe.UserData = wakeTag
	return nil
}

// requestStop makes the thread leave its loop without completing its requests.
func (q *queue) requestStop() {
	q.stop.Store(true)
	q.wake()
}

func (q *queue) wake() {
	one := [8]byte{1}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.wakeFd >= 0 { // closed once the thread is gone: never write to a reused number
		_, _ = unix.Write(q.wakeFd, one[:])
	}
}

// complete hands a request's result to the queue thread.
func (q *queue) complete(tag uint16, res int32) {
	q.mu.Lock()
	q.done = append(q.done, completion{tag, res})
	q.mu.Unlock()
	if q.sleeping.CompareAndSwap(true, false) {
		q.wake()
	}
}

func (q *queue) loop() error {
	live := q.depth // tags not yet aborted by the kernel
	inflight := 0   // requests fetched and not yet committed
	var batch []completion
	var ready []uint16
	var y uring.Yielder // see uring.Yielder: this thread never parks
	for live > 0 {
		if q.stop.Load() {
			return nil
		}
		// Commit what ended: on the ring (owned) and on goroutines (done).
		q.mu.Lock()
		batch, q.done = q.done, batch[:0]
		q.mu.Unlock()
		batch = append(batch, q.owned...)
		q.owned = q.owned[:0]
		inflight -= len(batch)
		for _, c := range batch {
			if err := q.commit(c); err != nil {
				return err
			}
		}
		// Sleep only if no result arrived since the swap; complete() sees sleeping and
		// wakes the thread through the eventfd otherwise.
		q.sleeping.Store(true)
		q.mu.Lock()
		more := len(q.done) > 0
		q.mu.Unlock()
		wait := uint32(1)
		if more || q.stop.Load() {
			wait = 0
		} else {
			y.Yield()
		}
		_, err := q.ring.SubmitAndWait(wait)
		q.sleeping.Store(false)
		if err != nil {
			return err
		}
		var n int
		if ready, n, err = q.reapCQEs(ready[:0]); err != nil {
			return err
		}
		live -= n
		inflight += len(ready)
		if err := q.dispatch(ready, inflight); err != nil {
			return err
		}
	}
	return nil
}

// reapCQEs takes every completion in the ring: member I/O goes to the ring queue (which may
// end requests into q.owned), fetched tags are appended to ready; it returns how many tags
// the kernel aborted or refused.
func (q *queue) reapCQEs(ready []uint16) (_ []uint16, gone int, _ error) {
	for {
		c, ok := q.ring.PeekCQE()
		if !ok {
			return ready, gone, nil
		}
		q.ring.SeenCQE()
		switch {
		case c.UserData&blockdev.RingTag != 0:
			q.rq.Reap(c)
			continue
		case c.UserData == wakeTag:
			if err := q.armWake(); err != nil {
				return ready, gone, err
			}
			continue
		case c.UserData&(copyInTag|copyOutTag) != 0:
			if err := q.copied(c); err != nil {
				return ready, gone, err
			}
			continue
		}
		tag := uint16(c.UserData)
		switch c.Res {
		case ioResOK:
			ready = append(ready, tag)
		case ioResAbort:
			gone++
		default:
			gone++
			klog.ErrorS(c.Err(), "ublk: request command refused", "device", q.d.id, "queue", q.id, "tag", tag)
		}
	}
}

// dispatch starts the fetched requests. On a ring queue, reads and plain writes go on the
// thread's ring (queued); the rest, and everything without one, go to goroutines, except a
// lone request with nothing else in flight (queue depth 1), which is served on this thread:
// no goroutine hand-off and no eventfd wake-up, two thread switches fewer.
func (q *queue) dispatch(ready []uint16, inflight int) error {
	for _, tag := range ready {
		q.serving.Add(1)
		if q.zc != nil {
			if err := q.startZeroCopy(tag); err != nil {
				return err
			}
			continue
		}
		q.dispatchOne(tag, len(ready) == 1 && inflight == 1)
	}
	if q.zc != nil {
		if err := q.redoZeroCopy(); err != nil {
			return err
		}
	}
	if q.aq != nil && q.rq == nil {
		return q.aq.Submit() // a ring queue's I/O leaves with the thread's next enter
	}
	return nil
}

// dispatchOne starts one request the copying way (see dispatch); lone serves it on the
// thread.
func (q *queue) dispatchOne(tag uint16, lone bool) {
	switch {
	case q.rq != nil && q.queued(tag):
	case lone:
		q.serve(tag)
	case q.rq == nil && q.queued(tag):
	default:
		go q.serve(tag)
	}
}

// request decodes the kernel's descriptor of tag: the operation, its flags, and the byte
// range.
func (q *queue) request(tag uint16) (op, flags uint32, off, n int64) {
	desc := (*ioDesc)(unsafe.Pointer(&q.descs[int(tag)*ioDescSize]))
	return desc.opFlags & 0xff, desc.opFlags >> 8 << 8, int64(desc.startSector) << sectorShift, int64(desc.nrSectors) << sectorShift
}

// serve carries out the request of tag on the backend and hands its result back.
func (q *queue) serve(tag uint16) {
	defer q.serving.Done()
	op, flags, off, n := q.request(tag)
	b := q.d.backend
	var err error
	res := int32(0)
	switch op {
	case opRead:
		_, err = b.ReadAt(q.buf(tag)[:n], off)
		res = int32(n)
		q.stats.reads.Add(1)
		q.stats.bytesRead.Add(uint64(n))
	case opWrite:
		p := q.buf(tag)[:n]
		if fw, ok := b.(blockdev.FUAWriter); ok && flags&ioFlagFUA != 0 {
			_, err = fw.WriteAtFUA(p, off)
		} else if _, err = b.WriteAt(p, off); err == nil && flags&ioFlagFUA != 0 {
			err = b.Flush()
		}
		res = int32(n)
		q.stats.writes.Add(1)
		q.stats.bytesWritten.Add(uint64(n))
	case opFlush:
		err = b.Flush()
		q.stats.flushes.Add(1)
	case opDiscard:
		if dc, ok := b.(blockdev.Discarder); ok {
			err = dc.Discard(off, n)
		}
		q.stats.discards.Add(1)
	case opWriteZeroes:
		if zw, ok := b.(blockdev.ZeroWriter); ok {
			err = zw.WriteZeroes(off, n)
		} else {
			err = syscall.EOPNOTSUPP
		}
	default:
		err = syscall.EOPNOTSUPP
	}
	if err != nil {
		res = -int32(blockdev.Errno(err))
		q.stats.errors.Add(1)
		klog.V(2).InfoS("ublk request failed", "device", q.d.id, "op", op, "offset", off, "length", n, "err", err)
	}
	q.complete(tag, res)
}
