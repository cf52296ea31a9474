package uring

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Fixed buffers: a table of buffers registered with the ring once, named by index in
// READ_FIXED and WRITE_FIXED, so the kernel does not pin and map the pages on every I/O. A
// slot holds user memory (RegisterBuffers) or, in a sparse table (RegisterSparseBuffers,
// 5.19+), nothing until something installs a buffer there: a driver such as ublk puts a
// block request's own pages in a slot (a kernel buffer), which the ring's I/O then reads into
// or writes from with no copy.
//
// The address in a fixed SQE is where the I/O starts inside the slot's buffer, the offset
// being the address less the buffer's start: for user memory its own address, for a kernel
// buffer the start is 0, so the address is the byte offset in the buffer.

// The opcodes of I/O on a fixed buffer.
const (
	OpReadFixed  Opcode = 4
	OpWriteFixed Opcode = 5
)

// io_uring_register(2) opcodes and flags.
const (
	registerBuffers   = 0
	unregisterBuffers = 1
	registerBuffers2  = 15 // struct io_uring_rsrc_register (5.13+)

	rsrcRegisterSparse = 1 << 0 // IORING_RSRC_REGISTER_SPARSE (5.19+)
)

// rsrcRegister is struct io_uring_rsrc_register.
type rsrcRegister struct {
	nr    uint32
	flags uint32
	resv2 uint64
	data  uint64 // iovecs (buffers) when not sparse
	tags  uint64
}

func (r *Ring) register(op uint32, arg unsafe.Pointer, nr uint32) error {
	if r.fd < 0 {
		return ErrClosed
	}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uintptr(op), uintptr(arg), uintptr(nr), 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR: // the kernel waits for the ring to be idle; a signal cuts that short
			continue
		}
		return errno
	}
}

// RegisterBuffers registers bufs as the ring's fixed buffers, slot i holding bufs[i]. Each
// stays pinned (and must stay alive and unmoved) until UnregisterBuffers or Close. A ring
// has one table: register again only after UnregisterBuffers.
func (r *Ring) RegisterBuffers(bufs [][]byte) error {
	if len(bufs) == 0 {
		return fmt.Errorf("uring: register no buffers")
	}
	iov := make([]unix.Iovec, len(bufs))
	for i, b := range bufs {
		if len(b) == 0 {
			return fmt.Errorf("uring: register buffer %d: empty", i)
		}
		iov[i].Base = &b[0]
		iov[i].SetLen(len(b))
	}
	err := r.register(registerBuffers, unsafe.Pointer(&iov[0]), uint32(len(iov)))
	runtime.KeepAlive(bufs)
	if err != nil {
		return fmt.Errorf("uring: register %d fixed buffers: %w", len(bufs), err)
	}
	return nil
}

// RegisterSparseBuffers registers a table of n empty fixed-buffer slots (Linux 5.19+), for a
// driver to install its own buffers in (ublk's automatic buffer registration puts each
// fetched request's pages at the index its command names).
func (r *Ring) RegisterSparseBuffers(n uint32) error {
	if n == 0 {
		return fmt.Errorf("uring: register a sparse table of no buffers")
	}
	rr := rsrcRegister{nr: n, flags: rsrcRegisterSparse}
	if err := r.register(registerBuffers2, unsafe.Pointer(&rr), uint32(unsafe.Sizeof(rr))); err != nil {
		return fmt.Errorf("uring: register a sparse table of %d fixed buffers: %w", n, err)
	}
	return nil
}

// UnregisterBuffers removes the ring's fixed-buffer table. I/O in flight keeps the buffers it
// uses until it completes.
func (r *Ring) UnregisterBuffers() error {
	if err := r.register(unregisterBuffers, nil, 0); err != nil {
		return fmt.Errorf("uring: unregister fixed buffers: %w", err)
	}
	return nil
}

// PrepReadFixed makes sqe a read of n bytes at off from fd into fixed buffer index, starting
// at addr (see above: a user buffer's own address, or the byte offset in a kernel buffer).
func (sqe *SQE) PrepReadFixed(fd int, addr uint64, n uint32, off uint64, index uint16) {
	sqe.Opcode, sqe.Fd, sqe.Off = OpReadFixed, int32(fd), off
	sqe.Addr, sqe.Len, sqe.BufIndex = addr, n, index
}

// PrepWriteFixed makes sqe a write of n bytes at off to fd from fixed buffer index, starting
// at addr (as PrepReadFixed).
func (sqe *SQE) PrepWriteFixed(fd int, addr uint64, n uint32, off uint64, index uint16) {
	sqe.Opcode, sqe.Fd, sqe.Off = OpWriteFixed, int32(fd), off
	sqe.Addr, sqe.Len, sqe.BufIndex = addr, n, index
}

// BufAddr is the address of b's first byte, for the addr of a fixed SQE on a user buffer.
func BufAddr(b []byte) uint64 { return bufAddr(b) }

// Fixed names where an I/O's data is in the ring's fixed-buffer table: slot Index, from
// address Addr (a user buffer's own address; the byte offset in a kernel buffer).
type Fixed struct {
	Index uint16
	Addr  uint64
}
