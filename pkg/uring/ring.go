package uring

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SetupFlags are io_uring_setup flags (IORING_SETUP_*).
type SetupFlags uint32

// The setup flags this package uses.
const (
	// SetupSQE128 makes every SQE 128 bytes: the last 80 are a command area for URING_CMD.
	SetupSQE128 SetupFlags = 1 << 10
	// SetupCoopTaskrun lets the kernel run completion task work only when the task enters
	// the kernel, instead of interrupting it (5.19+).
	SetupCoopTaskrun SetupFlags = 1 << 8
	// SetupSingleIssuer promises that one task submits (6.0+).
	SetupSingleIssuer SetupFlags = 1 << 12
)

// Opcode is an SQE opcode (IORING_OP_*).
type Opcode uint8

// The opcodes this package prepares.
const (
	OpNop      Opcode = 0
	OpTimeout  Opcode = 11
	OpRead     Opcode = 22
	OpWrite    Opcode = 23
	OpURingCmd Opcode = 46
)

const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	featSingleMmap = 1 << 0
	featExtArg     = 1 << 8

	enterGetEvents = 1 << 0
	enterExtArg    = 1 << 3

	sqeSize    = 64
	sqe128Size = 128
	cqeSize    = 16
	// CmdOffset is where the command area of a URING_CMD SQE starts.
	CmdOffset = 48
)

// Errors of this package.
var (
	// ErrSQFull is returned by GetSQE when every submission slot holds an unsubmitted SQE.
	ErrSQFull = errors.New("uring: submission queue full")
	// ErrClosed is returned by a Ring that was closed.
	ErrClosed = errors.New("uring: ring closed")
)

// params is struct io_uring_params (120 bytes).
type params struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFd         uint32
	resv         [3]uint32
	sqOff        sqringOffsets
	cqOff        cqringOffsets
}

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// SQE is the first 64 bytes of a submission queue entry, field for field (see doc.go).
type SQE struct {
	Opcode      Opcode
	Flags       uint8
	IoPrio      uint16
	Fd          int32
	Off         uint64 // URING_CMD: the command opcode in the low 32 bits
	Addr        uint64
	Len         uint32
	OpFlags     uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFdIn  int32
	Addr3       uint64
	pad         uint64
}

// CQE is a completion queue entry.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// Err returns the completion's result as an error: nil when Res >= 0, else the errno.
func (c CQE) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return unix.Errno(-c.Res)
}

// Ring is one io_uring instance. It is owned by one goroutine.
type Ring struct {
	fd       int
	flags    SetupFlags
	sqeBytes uintptr

	ringMem []byte // SQ ring (and CQ ring with a single mmap)
	cqMem   []byte // CQ ring when mapped apart
	sqeMem  []byte

	sqHead, sqTail, sqMask, sqEntries *uint32
	sqArray                           unsafe.Pointer
	cqHead, cqTail, cqMask, cqEntries *uint32
	cqes                              unsafe.Pointer

	sqeTail   uint32 // next SQE slot handed out (ahead of *sqTail until Submit)
	submitted uint32 // the value *sqTail was last set to
	features  uint32 // IORING_FEAT_* of the kernel
}

// getEventsArg is struct io_uring_getevents_arg, io_uring_enter's argument with
// IORING_ENTER_EXT_ARG.
type getEventsArg struct {
	sigmask   uint64
	sigmaskSz uint32
	pad       uint32
	ts        uint64 // a *Timespec
}

// New sets up a ring with at least entries submission slots (a power of two is used as is)
// and maps its rings.
func New(entries uint32, flags SetupFlags) (*Ring, error) {
	var p params
	p.flags = uint32(flags)
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("uring: io_uring_setup(%d, %#x): %w", entries, uint32(flags), errno)
	}
	r := &Ring{fd: int(fd), flags: flags, sqeBytes: sqeSize, features: p.features}
	if flags&SetupSQE128 != 0 {
		r.sqeBytes = sqe128Size
	}
	if err := r.mapRings(&p); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mapRings(p *params) error {
	sqLen := int(p.sqOff.array + p.sqEntries*4)
	cqLen := int(p.cqOff.cqes + p.cqEntries*cqeSize)
	single := p.features&featSingleMmap != 0
	if single && cqLen > sqLen {
		sqLen = cqLen
	}
	var err error
	prot, fl := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.ringMem, err = unix.Mmap(r.fd, offSQRing, sqLen, prot, fl); err != nil {
		return fmt.Errorf("uring: mmap SQ ring (%d bytes): %w", sqLen, err)
	}
	cq := r.ringMem
	if !single {
		if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqLen, prot, fl); err != nil {
			return fmt.Errorf("uring: mmap CQ ring (%d bytes): %w", cqLen, err)
		}
		cq = r.cqMem
	}
	sqesLen := int(p.sqEntries) * int(r.sqeBytes)
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqesLen, prot, fl); err != nil {
		return fmt.Errorf("uring: mmap SQEs (%d bytes): %w", sqesLen, err)
	}
	sq := unsafe.Pointer(&r.ringMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff.tail))
	r.sqMask = (*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.sqEntries = (*uint32)(unsafe.Add(sq, p.sqOff.ringEntries))
	r.sqArray = unsafe.Add(sq, p.sqOff.array)
	c := unsafe.Pointer(&cq[0])
	r.cqHead = (*uint32)(unsafe.Add(c, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(c, p.cqOff.tail))
	r.cqMask = (*uint32)(unsafe.Add(c, p.cqOff.ringMask))
	r.cqEntries = (*uint32)(unsafe.Add(c, p.cqOff.ringEntries))
	r.cqes = unsafe.Add(c, p.cqOff.cqes)
	r.sqeTail = atomic.LoadUint32(r.sqTail)
	r.submitted = r.sqeTail
	return nil
}

// Close unmaps the rings and closes the ring's descriptor. Requests in flight are cancelled
// by the kernel.
func (r *Ring) Close() error {
	var errs []error
	for _, m := range []*[]byte{&r.sqeMem, &r.cqMem, &r.ringMem} {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	return errors.Join(errs...)
}

// Fd is the ring's file descriptor.
func (r *Ring) Fd() int { return r.fd }

// Entries is the number of submission slots.
func (r *Ring) Entries() uint32 { return *r.sqEntries }

// CQEntries is the number of completion slots.
func (r *Ring) CQEntries() uint32 { return *r.cqEntries }

// GetSQE returns the next free submission slot, zeroed (all 64 or 128 bytes). It is
// handed to the kernel by the next Submit or SubmitAndWait.
func (r *Ring) GetSQE() (*SQE, error) {
	if r.fd < 0 {
		return nil, ErrClosed
	}
	head := atomic.LoadUint32(r.sqHead)
	if r.sqeTail-head >= *r.sqEntries {
		return nil, ErrSQFull
	}
	idx := r.sqeTail & *r.sqMask
	p := unsafe.Pointer(&r.sqeMem[uintptr(idx)*r.sqeBytes])
	clear(unsafe.Slice((*byte)(p), r.sqeBytes))
	*(*uint32)(unsafe.Add(r.sqArray, uintptr(idx)*4)) = idx
	r.sqeTail++
	return (*SQE)(p), nil
}

// Cmd returns the command area of sqe, which must come from r's GetSQE: 80 bytes in a
// SetupSQE128 ring, 16 in a plain one.
func (r *Ring) Cmd(sqe *SQE) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(sqe), CmdOffset)), int(r.sqeBytes)-CmdOffset)
}

// Pending is the number of SQEs taken with GetSQE and not yet submitted.
func (r *Ring) Pending() uint32 { return r.sqeTail - r.submitted }

// flush publishes the prepared SQEs to the kernel and returns how many there were.
func (r *Ring) flush() uint32 {
	n := r.sqeTail - r.submitted
	if n > 0 {
		atomic.StoreUint32(r.sqTail, r.sqeTail)
		r.submitted = r.sqeTail
	}
	return n
}

// Submit hands the prepared SQEs to the kernel without waiting, and returns how many it took.
func (r *Ring) Submit() (int, error) {
	return r.enter(r.flush(), 0, 0)
}

// SubmitAndWait hands the prepared SQEs to the kernel and waits until at least waitNr
// completions are in the CQ ring (counting those already there).
func (r *Ring) SubmitAndWait(waitNr uint32) (int, error) {
	n := r.flush()
	if waitNr == 0 {
		return r.enter(n, 0, 0)
	}
	return r.enter(n, waitNr, enterGetEvents)
}

// enter calls io_uring_enter, retrying on EINTR with whatever SQEs the kernel has not yet
// consumed (the SQ head says how far it got).
func (r *Ring) enter(toSubmit, minComplete uint32, flags uint32) (int, error) {
	if r.fd < 0 {
		return 0, ErrClosed
	}
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
		if errno == 0 {
			return int(n), nil
		}
		if errno != unix.EINTR {
			return 0, fmt.Errorf("uring: io_uring_enter: %w", errno)
		}
		toSubmit = r.submitted - atomic.LoadUint32(r.sqHead)
	}
}

// CanWaitTimeout reports whether the kernel bounds a wait by a timeout (IORING_FEAT_EXT_ARG,
// 5.11+): SubmitAndWaitTimeout needs it.
func (r *Ring) CanWaitTimeout() bool { return r.features&featExtArg != 0 }

// SubmitAndWaitTimeout is SubmitAndWait bounded by ts: it also returns, with no error, when
// ts passed first or a signal interrupted the wait; the caller looks at the CQ ring again. It
// needs CanWaitTimeout.
func (r *Ring) SubmitAndWaitTimeout(waitNr uint32, ts *Timespec) error {
	if r.fd < 0 {
		return ErrClosed
	}
	arg := getEventsArg{sigmaskSz: 8, ts: uint64(uintptr(unsafe.Pointer(ts)))}
	n := r.flush()
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), uintptr(waitNr),
		enterGetEvents|enterExtArg, uintptr(unsafe.Pointer(&arg)), unsafe.Sizeof(arg))
	runtime.KeepAlive(ts)
	switch errno {
	case 0, unix.ETIME:
		return nil
	case unix.EINTR: // submit what the kernel did not take, without waiting
		_, err := r.enter(r.submitted-atomic.LoadUint32(r.sqHead), 0, 0)
		return err
	}
	return fmt.Errorf("uring: io_uring_enter(ext arg): %w", errno)
}

// WaitCompletions waits until at least n completions are in the CQ ring, submitting nothing.
// It is the completer's side of a ring whose submitter is another goroutine: the kernel
// allows one goroutine to submit (GetSQE, Submit) while another waits and consumes
// completions (WaitCompletions, PeekCQE, SeenCQE), each side owning its own indexes. An
// interrupted wait returns nil early; the caller looks at the CQ ring again.
func (r *Ring) WaitCompletions(n uint32) error {
	if r.fd < 0 {
		return ErrClosed
	}
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, uintptr(n), enterGetEvents, 0, 0)
	if errno != 0 && errno != unix.EINTR {
		return fmt.Errorf("uring: io_uring_enter(getevents): %w", errno)
	}
	return nil
}

// PeekCQE returns the oldest completion not yet marked seen, if any.
func (r *Ring) PeekCQE() (CQE, bool) {
	head := *r.cqHead
	if head == atomic.LoadUint32(r.cqTail) {
		return CQE{}, false
	}
	p := (*CQE)(unsafe.Add(r.cqes, uintptr(head&*r.cqMask)*cqeSize))
	return *p, true
}

// SeenCQE marks the completion returned by PeekCQE as consumed, freeing its slot.
func (r *Ring) SeenCQE() {
	atomic.StoreUint32(r.cqHead, *r.cqHead+1)
}

// WaitCQE returns the oldest completion, waiting for one if there is none; it also submits
// any prepared SQEs. The completion is consumed.
func (r *Ring) WaitCQE() (CQE, error) {
	for {
		if c, ok := r.PeekCQE(); ok {
			r.SeenCQE()
			return c, nil
		}
		if _, err := r.SubmitAndWait(1); err != nil {
			return CQE{}, err
		}
	}
}

// PrepNop makes sqe a no-op: it completes with res 0.
func (sqe *SQE) PrepNop() { sqe.Opcode = OpNop }

// Timespec is struct __kernel_timespec, the time of a timeout.
type Timespec struct {
	Sec, Nsec int64
}

// PrepTimeout makes sqe a relative timeout of ts: it completes with -ETIME once ts has
// passed (a wake-up for an owner that waits on its ring for something that arrives
// elsewhere). The kernel reads ts when the SQE is submitted: keep it unchanged and unmoved
// until then (not in a variable on the goroutine's stack, which moves when it grows: pin a
// heap copy).
func (sqe *SQE) PrepTimeout(ts *Timespec) {
	sqe.Opcode = OpTimeout
	sqe.Addr, sqe.Len = uint64(uintptr(unsafe.Pointer(ts))), 1
}

// PrepRead makes sqe a read of len(buf) bytes at off from fd into buf. buf must stay alive
// and unmoved until the completion: heap memory (a goroutine's stack moves when it grows or
// shrinks), or memory outside the Go heap.
func (sqe *SQE) PrepRead(fd int, buf []byte, off uint64) {
	sqe.Opcode, sqe.Fd, sqe.Off = OpRead, int32(fd), off
	sqe.Addr, sqe.Len = bufAddr(buf), uint32(len(buf))
}

// PrepWrite makes sqe a write of buf at off to fd. buf must stay alive and unmoved until the
// completion.
func (sqe *SQE) PrepWrite(fd int, buf []byte, off uint64) {
	sqe.Opcode, sqe.Fd, sqe.Off = OpWrite, int32(fd), off
	sqe.Addr, sqe.Len = bufAddr(buf), uint32(len(buf))
}

// PrepURingCmd makes sqe a URING_CMD with command opcode op to fd; its payload goes in the
// command area (Ring.Cmd).
func (sqe *SQE) PrepURingCmd(fd int, op uint32) {
	sqe.Opcode, sqe.Fd, sqe.Off = OpURingCmd, int32(fd), uint64(op)
}

func bufAddr(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}
