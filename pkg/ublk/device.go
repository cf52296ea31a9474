package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// Defaults and limits of Options.
const (
	// MaxQueues caps the queues of a device (one per CPU up to this).
	MaxQueues     = 4
	DefaultDepth  = 64
	DefaultMaxIO  = 1 << 20
	maxMaxIO      = 32 << 20
	discardLimit  = 1 << 30
	pageSize      = 4096
	sectorShift   = 9
	physicalShift = 12
)

// Options shape a new device. The zero value is usable.
type Options struct {
	// Queues is the number of hardware queues, each served by its own thread (default: one
	// per CPU, at most MaxQueues).
	Queues int
	// Depth is the number of requests in flight per queue (default 64, at most 4096).
	Depth int
	// MaxIO is the largest request in bytes (default 1 MiB, at most 32 MiB; a multiple of
	// 4 KiB).
	MaxIO int
	// BlockSize is the logical block size, 512 or 4096 (default 4096: the RAID10 engine
	// takes only 4 KiB-aligned I/O, as the NBD export tells its clients).
	BlockSize int
	// NoRecovery leaves out user recovery: the device then fails its I/O and goes away
	// when the serving process exits, instead of waiting for a new one (Recover).
	NoRecovery bool
	// NoZeroCopy keeps the copying data path where the kernel has automatic buffer
	// registration (UBLK_F_AUTO_BUF_REG, 6.16+), which Create otherwise takes for a backend
	// with ring queues (zerocopy.go).
	NoZeroCopy bool
}

func (o Options) withDefaults() (Options, error) {
	if o.Queues == 0 {
		o.Queues = min(runtime.NumCPU(), MaxQueues)
	}
	if o.Depth == 0 {
		o.Depth = DefaultDepth
	}
	if o.MaxIO == 0 {
		o.MaxIO = DefaultMaxIO
	}
	if o.BlockSize == 0 {
		o.BlockSize = pageSize
	}
	switch {
	case o.BlockSize != 512 && o.BlockSize != pageSize:
		return o, fmt.Errorf("ublk: block size %d: want 512 or 4096", o.BlockSize)
	case o.Queues < 1 || o.Queues > 64:
		return o, fmt.Errorf("ublk: %d queues: want 1 to 64", o.Queues)
	case o.Depth < 1 || o.Depth > maxQueueDepth:
		return o, fmt.Errorf("ublk: queue depth %d: want 1 to %d", o.Depth, maxQueueDepth)
	case o.MaxIO < pageSize || o.MaxIO > maxMaxIO || o.MaxIO%pageSize != 0:
		return o, fmt.Errorf("ublk: max I/O %d bytes: want a multiple of 4096 from 4 KiB to 32 MiB", o.MaxIO)
	}
	return o, nil
}

// Device is a ublk device served by this process.
type Device struct {
	id      int
	info    DevInfo
	backend blockdev.Backend
	char    *os.File
	queues  []*queue
	wg      sync.WaitGroup

	mu     sync.Mutex
	closed bool
}

// ID is the device number N of /dev/ublkbN.
func (d *Device) ID() int { return d.id }

// Path is the block device, /dev/ublkbN.
func (d *Device) Path() string { return BlockPath(d.id) }

// Info is the device's info as added (or found at recovery).
func (d *Device) Info() DevInfo { return d.info }

// Create adds a device of b's size, sets its parameters, starts one serving thread per
// queue and starts the device; /dev/ublkbN exists when it returns. With user recovery (the
// default), if this process dies the device waits, I/O queued, for Recover in a new one.
func Create(ctx context.Context, b blockdev.Backend, opts Options) (*Device, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	size := b.Size()
	if size <= 0 || size%pageSize != 0 {
		return nil, fmt.Errorf("ublk: backend size %d: want a positive multiple of 4096", size)
	}
	info := DevInfo{
		NrHwQueues:    uint16(o.Queues),
		QueueDepth:    uint16(o.Depth),
		MaxIOBufBytes: uint32(o.MaxIO),
		DevID:         ^uint32(0),
		ServerPID:     int32(os.Getpid()),
		Flags:         FlagCmdIoctlEncode,
		ServerFlags:   serverMark,
	}
	if !o.NoRecovery {
		info.Flags |= FlagUserRecovery | FlagUserRecoveryReissue
	}
	info.Flags |= zeroCopyFlag(ctx, b, o)
	ib := unsafe.Slice((*byte)(unsafe.Pointer(&info)), devInfoSize)
	if err := control(ctx, cmdAddDev, ^uint32(0), 0, ib); err != nil {
		return nil, err
	}
	d := &Device{id: int(info.DevID), info: info, backend: b}
	if d.info.MaxIOBufBytes < uint32(o.MaxIO) {
		return nil, d.fail(ctx, fmt.Errorf("ublk: kernel lowered max I/O to %d bytes", d.info.MaxIOBufBytes))
	}
	p := d.params(size, o.BlockSize)
	pb := unsafe.Slice((*byte)(unsafe.Pointer(&p)), paramsSize)
	if err := control(ctx, cmdSetParams, uint32(d.id), 0, pb); err != nil {
		return nil, d.fail(ctx, err)
	}
	if err := d.startQueues(ctx); err != nil {
		return nil, d.fail(ctx, err)
	}
	if err := control(ctx, cmdStartDev, uint32(d.id), uint64(os.Getpid()), nil); err != nil {
		return nil, d.fail(ctx, err)
	}
	if err := waitPath(ctx, d.Path()); err != nil {
		return nil, d.fail(ctx, err)
	}
	klog.InfoS("ublk device started", "device", d.Path(), "queues", o.Queues, "depth", o.Depth, "maxIO", o.MaxIO, "size", size, "zeroCopy", d.ZeroCopy())
	return d, nil
}

// params are the device's block parameters: logical blocks of blockSize, 4 KiB physical,
// a volatile cache with FUA (writes flushed by REQ_OP_FLUSH), requests up to MaxIO, and
// discard and write-zeroes when the backend has them.
func (d *Device) params(size int64, blockSize int) params {
	shift := uint8(sectorShift)
	if blockSize == pageSize {
		shift = physicalShift
	}
	p := params{
		len:             paramsSize,
		types:           paramTypeBasic,
		attrs:           attrVolatileCache | attrFUA,
		logicalBSShift:  shift,
		physicalBSShift: physicalShift,
		ioMinShift:      physicalShift,
		ioOptShift:      physicalShift,
		maxSectors:      d.info.MaxIOBufBytes >> sectorShift,
		devSectors:      uint64(size) >> sectorShift,
	}
	if cs, ok := d.backend.(chunked); ok && d.ZeroCopy() && cs.ChunkSize()>>sectorShift <= 1<<31 {
		// The block layer splits requests at chunk boundaries: a request within one chunk
		// is what the engine's zero-copy path takes (zerocopy.go).
		p.chunkSectors = uint32(cs.ChunkSize() >> sectorShift)
	}
	_, canDiscard := d.backend.(blockdev.Discarder)
	_, canZero := d.backend.(blockdev.ZeroWriter)
	if canDiscard || canZero {
		p.types |= paramTypeDiscard
		p.discardGranularity = pageSize
		p.maxDiscardSegments = 1
		if canDiscard {
			p.maxDiscardSectors = discardLimit >> sectorShift
		}
		if canZero {
			p.maxWriteZeroesSectors = discardLimit >> sectorShift
		}
	}
	return p
}

// Recover takes over device id, left by a server that exited (killed or detached): it waits
// for the kernel to quiesce the device, starts this process's queues and ends the recovery;
// the requests the old server had not completed are issued again to this one.
func Recover(ctx context.Context, id int, b blockdev.Backend) (*Device, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	var info DevInfo
	for {
		var err error
		if info, err = GetInfo(ctx, id); err != nil {
			return nil, err
		}
		if !info.Ours() {
			return nil, fmt.Errorf("%w: device %d", ErrNotOurs, id)
		}
		if !info.Recoverable() {
			return nil, fmt.Errorf("%w: device %d is %s with flags %#x", ErrNotRecoverable, id, info.State, uint64(info.Flags))
		}
		if info.State == StateQuiesced {
			// START_USER_RECOVERY also needs the old server's /dev/ublkcN closed: EBUSY
			// until its process has gone.
			err = control(ctx, cmdStartUserRecovery, uint32(id), 0, nil)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("ublk: device %d still %s (its old server has not gone): %w", id, info.State, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	d := &Device{id: id, info: info, backend: b}
	if err := d.startQueues(ctx); err != nil {
		d.detach()
		return nil, err
	}
	if err := control(ctx, cmdEndUserRecovery, uint32(id), uint64(os.Getpid()), nil); err != nil {
		d.detach()
		return nil, err
	}
	klog.InfoS("ublk device recovered", "device", d.Path(), "queues", info.NrHwQueues, "depth", info.QueueDepth, "zeroCopy", d.ZeroCopy())
	return d, nil
}

// startQueues opens /dev/ublkcN and starts a thread per queue, each of which has fetched
// all its requests from the kernel when this returns without error.
func (d *Device) startQueues(ctx context.Context) error {
	if err := waitPath(ctx, CharPath(d.id)); err != nil {
		return err
	}
	f, err := os.OpenFile(CharPath(d.id), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("ublk: open %s: %w", CharPath(d.id), err)
	}
	d.char = f
	for q := 0; q < int(d.info.NrHwQueues); q++ {
		qu := newQueue(d, q)
		ready := make(chan error, 1)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			qu.run(ready)
		}()
		if err := <-ready; err != nil {
			return err
		}
		d.queues = append(d.queues, qu)
	}
	return nil
}

// fail undoes a Create that did not finish.
func (d *Device) fail(ctx context.Context, err error) error {
	_ = control(ctx, cmdStopDev, uint32(d.id), 0, nil)
	d.detach()
	if derr := delDev(ctx, d.id); derr != nil {
		klog.ErrorS(derr, "ublk: could not delete a device whose creation failed", "device", d.id)
	}
	return err
}

// detach stops every queue thread without completing their requests and closes the
// character device.
func (d *Device) detach() {
	for _, q := range d.queues {
		q.requestStop()
	}
	d.wg.Wait()
	// The kernel hands a queue to a new server only once the old queue thread is exiting
	// (START_USER_RECOVERY warns otherwise); the runtime ends a locked thread just after
	// its goroutine, so wait for that.
	for _, q := range d.queues {
		waitThreadGone(q.tid)
	}
	if d.char != nil {
		_ = d.char.Close()
		d.char = nil
	}
}

// waitThreadGone waits up to a second for thread tid of this process to end.
func waitThreadGone(tid int) {
	if tid == 0 {
		return
	}
	p := fmt.Sprintf("/proc/self/task/%d", tid)
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(p); err != nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	klog.InfoS("ublk: queue thread still there a second after its goroutine ended", "tid", tid)
}

// Detach stops serving and leaves the device to a new server: the kernel quiesces it and
// keeps new and unfinished I/O queued until Recover (in this process or another). Without
// user recovery the device fails its I/O and is removed. A detached Device cannot be used
// again.
func (d *Device) Detach() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	d.detach()
	klog.InfoS("ublk device detached", "device", d.Path())
}

// Delete stops the device (its block device goes away, so it must no longer be in use) and
// removes it.
func (d *Device) Delete(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return Delete(ctx, d.id)
	}
	d.closed = true
	// STOP_DEV removes the disk and aborts every fetched request: each queue thread sees
	// its tags end and exits.
	err := control(ctx, cmdStopDev, uint32(d.id), 0, nil)
	if err != nil && !errors.Is(err, unix.ENODEV) {
		d.detach()
		return err
	}
	d.detach()
	if err := delDev(ctx, d.id); err != nil {
		return err
	}
	klog.InfoS("ublk device deleted", "device", d.Path())
	return nil
}

// Stats are a device's counters.
type Stats struct {
	Reads, Writes, Flushes, Discards, Errors uint64
	BytesRead, BytesWritten                  uint64
}

// Stats sums the counters of every queue.
func (d *Device) Stats() Stats {
	var s Stats
	for _, q := range d.queues {
		s.Reads += q.stats.reads.Load()
		s.Writes += q.stats.writes.Load()
		s.Flushes += q.stats.flushes.Load()
		s.Discards += q.stats.discards.Load()
		s.Errors += q.stats.errors.Load()
		s.BytesRead += q.stats.bytesRead.Load()
		s.BytesWritten += q.stats.bytesWritten.Load()
	}
	return s
}

// Resize makes the block device size bytes large while it is served (UPDATE_SIZE): the
// kernel announces the new capacity at once, and a filesystem on it can then grow online.
// The backend must serve at least that much already. On a kernel without UPDATE_SIZE
// (before Linux 6.16) it is ErrNoResize, and the device keeps its size until it is added
// again.
func (d *Device) Resize(ctx context.Context, size int64) error {
	if size <= 0 || size%pageSize != 0 || size > d.backend.Size() {
		return fmt.Errorf("ublk: resize %s to %d bytes: want a positive multiple of 4096 up to the backend's %d", d.Path(), size, d.backend.Size())
	}
	f, err := Features(ctx)
	if err != nil {
		return err
	}
	if !f.Has(FlagUpdateSize) {
		return fmt.Errorf("%w: %s stays at its size (kernel features %s)", ErrNoResize, d.Path(), f)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("ublk: resize %s: %w", d.Path(), os.ErrClosed)
	}
	if err := control(ctx, cmdUpdateSize, uint32(d.id), uint64(size)>>sectorShift, nil); err != nil {
		return err
	}
	klog.InfoS("ublk device resized", "device", d.Path(), "size", size)
	return nil
}

// Size is the block device's size in bytes, as the kernel has it (/sys/block/ublkbN/size).
func (d *Device) Size() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/ublkb%d/size", d.id))
	if err != nil {
		return 0, fmt.Errorf("ublk: size of %s: %w", d.Path(), err)
	}
	var sectors int64
	if _, err := fmt.Sscanf(string(b), "%d", &sectors); err != nil {
		return 0, fmt.Errorf("ublk: size of %s: %q: %w", d.Path(), b, err)
	}
	return sectors << sectorShift, nil
}
