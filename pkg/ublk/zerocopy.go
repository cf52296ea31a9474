package ublk

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// Zero copy (UBLK_F_AUTO_BUF_REG, Linux 6.16+; see doc.go): the kernel puts each fetched
// request's own pages in slot tag of the queue thread's ring (a sparse fixed-buffer table the
// thread registers), and the engine's member I/O reads into or writes from that slot
// (raid10's ReadFixed/WriteFixed). The kernel then copies nothing into the tag's buffer, for
// any request, so what is not served zero-copy copies between the slot and the tag's buffer
// on the ring itself: the buffers are a memfd's pages, and a WRITE_FIXED from the slot to the
// memfd at the tag's offset brings a write's data into the tag's buffer (copy in), a
// READ_FIXED from the memfd into the slot puts a read's data in the request (copy out).
//
// user_data of the copies on the queue's ring: copyInTag|tag, copyOutTag|tag.
const (
	copyInTag  = 1 << 33
	copyOutTag = 1 << 34
)

// chunked is a backend whose requests are best cut at multiples of ChunkSize bytes (the
// engine's chunk): a zero-copy device has the block layer split its requests there.
type chunked interface{ ChunkSize() int64 }

// fixedQueue is a ring queue whose member I/O can use the ring's fixed buffers (the RAID10
// engine's raid10.Queue).
type fixedQueue interface {
	ReadFixed(p []byte, off int64, buf uring.Fixed, done blockdev.OwnerCompleter, retry func()) bool
	WriteFixed(p []byte, off int64, buf uring.Fixed, done blockdev.OwnerCompleter, retry func()) bool
}

// zeroCopy is a queue's zero-copy state, owned by the queue thread.
type zeroCopy struct {
	memfd int
	fq    fixedQueue // nil: every request copies
	tags  []zcTag
	// redo holds tags to serve the copying way (a zero-copy request retried, a copy in
	// done), taken by the thread's next dispatch.
	redo []uint16
	// waiting counts the requests held here (a copy in in flight, a tag in redo): their
	// serving has not ended, and a thread that stops before they are served ends it.
	waiting int
}

// zcTag is one tag's request as zero copy sees it.
type zcTag struct {
	fixed bool  // its data moves by the engine's fixed-buffer I/O
	in    bool  // a write whose data is in the tag's buffer (copied in)
	res   int32 // a copying read's result, committed once copied out
}

// autoBufReg is the SQE's addr (not the command's, which must then be 0) of a FETCH or
// COMMIT_AND_FETCH with automatic buffer registration (struct ublk_auto_buf_reg: index in
// bits 0-15, flags 16-23, the rest reserved): the fetched request's pages go to slot tag. No UBLK_AUTO_BUF_REG_FALLBACK: slot
// tag is free at every fetch (the commit before it unregistered it), so registration fails
// only for want of kernel memory, and the kernel then fails that request (EIO).
func autoBufReg(tag uint16) uint64 { return uint64(tag) }

// zeroCopyFlag is FlagAutoBufReg where a new device takes zero copy: the kernel has automatic
// buffer registration, the backend has ring queues (whose member I/O can use the slots) and
// opts do not say NoZeroCopy; else 0.
func zeroCopyFlag(ctx context.Context, b blockdev.Backend, opts Options) Flags {
	if _, ok := b.(blockdev.RingBackend); !ok || opts.NoZeroCopy {
		return 0
	}
	f, err := Features(ctx)
	if err != nil || !f.Has(FlagAutoBufReg) {
		return 0
	}
	return FlagAutoBufReg
}

// setupZeroCopy makes the tags' buffers a memfd's pages and registers the sparse table the
// kernel puts requests in.
func (q *queue) setupZeroCopy() error {
	fd, err := unix.MemfdCreate(fmt.Sprintf("ublk%d-q%d", q.d.id, q.id), unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("ublk: memfd for the buffers of queue %d: %w", q.id, err)
	}
	q.zc = &zeroCopy{memfd: fd, tags: make([]zcTag, q.depth)}
	size := q.depth * q.maxIO
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fmt.Errorf("ublk: buffers of queue %d (%d bytes): %w", q.id, size, err)
	}
	if q.bufs, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("ublk: buffers of queue %d (%d bytes): %w", q.id, size, err)
	}
	return q.ring.RegisterSparseBuffers(uint32(q.depth))
}

// endWaiting ends the serving of the requests a stopped thread held (zeroCopy.waiting), once
// nothing can complete them any more (the ring queue closed).
func (q *queue) endWaiting() {
	for ; q.zc != nil && q.zc.waiting > 0; q.zc.waiting-- {
		q.serving.Done()
	}
}

func (q *queue) teardownZeroCopy() {
	if q.zc != nil && q.zc.memfd >= 0 {
		_ = unix.Close(q.zc.memfd)
		q.zc.memfd = -1
	}
}

// ZeroCopy reports whether the device's requests come with automatic buffer registration
// (chosen at Create where the kernel and the backend allow, kept by Recover).
func (d *Device) ZeroCopy() bool { return d.info.Flags.Has(FlagAutoBufReg) }

// ZeroCopyStats are the device's zero-copy counts: requests whose data the member I/O moved
// with no copy, and requests copied between their pages and the tag's buffer.
type ZeroCopyStats struct {
	ZeroCopied, Copied uint64
}

// ZeroCopyStats sums the counts of every queue.
func (d *Device) ZeroCopyStats() ZeroCopyStats {
	var s ZeroCopyStats
	for _, q := range d.queues {
		s.ZeroCopied += q.stats.zeroCopied.Load()
		s.Copied += q.stats.copied.Load()
	}
	return s
}

// startZeroCopy starts a fetched request of a zero-copy queue: on the engine's fixed-buffer
// path where it takes it, else the copying way (a write after its copy in).
func (q *queue) startZeroCopy(tag uint16) error {
	op, flags, off, n := q.request(tag)
	z := &q.zc.tags[tag]
	*z = zcTag{}
	if q.zc.fq != nil && n > 0 { // a ring queue, and so the tags' completers
		t := &q.dones[tag]
		t.bytes, t.read = n, op == opRead
		fb := uring.Fixed{Index: tag}
		switch {
		case op == opRead:
			z.fixed = q.zc.fq.ReadFixed(q.buf(tag)[:n], off, fb, t, t.retryFn)
		case op == opWrite && flags&ioFlagFUA == 0:
			z.fixed = q.zc.fq.WriteFixed(q.buf(tag)[:n], off, fb, t, t.retryFn)
		}
		if z.fixed {
			return nil
		}
	}
	if op == opWrite {
		return q.copyIn(tag, n)
	}
	q.dispatchOne(tag, false)
	return nil
}

// retry is the engine's retry of a zero-copy request (raid10's ReadFixed/WriteFixed),
// inside Reap: the thread serves it again the copying way at its next dispatch.
func (t *tagDone) retry() {
	q := t.q
	q.zc.tags[t.tag].fixed = false
	q.zc.redo = append(q.zc.redo, t.tag)
	q.zc.waiting++
}

// redoZeroCopy serves the requests left for the copying way: reads on the tag's buffer,
// writes once copied in.
func (q *queue) redoZeroCopy() error {
	redo := q.zc.redo
	q.zc.redo = q.zc.redo[:0]
	q.zc.waiting -= len(redo)
	for _, tag := range redo {
		if op, _, _, n := q.request(tag); op == opWrite && !q.zc.tags[tag].in {
			if err := q.copyIn(tag, n); err != nil {
				return err
			}
			continue
		}
		q.dispatchOne(tag, false)
	}
	return nil
}

// copyIn copies a write's n bytes from its slot into the tag's buffer.
func (q *queue) copyIn(tag uint16, n int64) error {
	sqe, err := q.getSQE()
	if err != nil {
		return err
	}
	sqe.PrepWriteFixed(q.zc.memfd, 0, uint32(n), uint64(int(tag)*q.maxIO), tag)
	sqe.UserData = copyInTag | uint64(tag)
	q.zc.waiting++
	return nil
}

// commit sends a request's result, a copying read's once its data is copied out to the
// request.
func (q *queue) commit(c completion) error {
	if q.zc != nil {
		op, _, _, _ := q.request(c.tag)
		if z := &q.zc.tags[c.tag]; op == opRead && !z.fixed && c.res > 0 {
			sqe, err := q.getSQE()
			if err != nil {
				return err
			}
			z.res = c.res
			sqe.PrepReadFixed(q.zc.memfd, 0, uint32(c.res), uint64(int(c.tag)*q.maxIO), c.tag)
			sqe.UserData = copyOutTag | uint64(c.tag)
			return nil
		}
	}
	return q.prepCmd(ioCommitAndFetchReq, c.tag, c.res)
}

// copied handles the completion of a copy in or out.
func (q *queue) copied(c uring.CQE) error {
	tag := uint16(c.UserData)
	_, _, _, n := q.request(tag)
	z := &q.zc.tags[tag]
	q.stats.copied.Add(1)
	if c.UserData&copyInTag != 0 {
		q.zc.waiting--
		if int64(c.Res) != n {
			return q.failCopy(tag, c)
		}
		z.in = true
		q.zc.redo = append(q.zc.redo, tag)
		q.zc.waiting++
		return nil
	}
	if c.Res != z.res {
		return q.failCopy(tag, c)
	}
	return q.prepCmd(ioCommitAndFetchReq, tag, z.res)
}

// failCopy ends a request whose copy failed with EIO: nothing else can move its data.
func (q *queue) failCopy(tag uint16, c uring.CQE) error {
	q.stats.errors.Add(1)
	err := c.Err()
	if err == nil {
		err = fmt.Errorf("short copy: %d bytes", c.Res)
	}
	klog.ErrorS(err, "ublk: copy between a request and its buffer failed", "device", q.d.id, "queue", q.id, "tag", tag)
	res := -int32(unix.EIO)
	if c.UserData&copyOutTag != 0 {
		return q.prepCmd(ioCommitAndFetchReq, tag, res) // its serving already ended
	}
	q.owned = append(q.owned, completion{tag, res})
	q.serving.Done()
	return nil
}

// countZeroCopy counts a request that ends having moved its data with no copy.
func (t *tagDone) countZeroCopy(err error) {
	if q := t.q; q.zc != nil && err == nil && q.zc.tags[t.tag].fixed {
		q.stats.zeroCopied.Add(1)
	}
}
