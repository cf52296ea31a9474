// Package uring is the small part of Linux io_uring that the ublk frontend and the engine's
// asynchronous Queue (pkg/raid10) need, written on
// golang.org/x/sys/unix: io_uring_setup, the mmapped submission and completion rings,
// io_uring_enter to submit and wait (also bounded by a timeout, IORING_ENTER_EXT_ARG), and
// the opcodes NOP, TIMEOUT, READ, WRITE, READ_FIXED, WRITE_FIXED and URING_CMD (a command
// passed to a driver's uring_cmd handler, the way /dev/ublk-control and /dev/ublkcN are
// driven), and fixed-buffer tables (fixed.go: user buffers, or a sparse table whose slots a
// driver fills, as ublk's zero copy does). No Go io_uring module is available to this project, hence its own.
//
// # Layout shared with the kernel
//
// io_uring_setup(2) returns a file descriptor and fills struct io_uring_params with the
// offsets of the ring fields. Three regions are mapped from that descriptor (one for both
// rings when the kernel reports IORING_FEAT_SINGLE_MMAP, 5.4+):
//
//	offset 0x00000000  SQ ring: head, tail, ring_mask, ring_entries, flags, dropped (u32),
//	                   array[ring_entries] (u32 indexes into the SQE array)
//	offset 0x08000000  CQ ring: head, tail, ring_mask, ring_entries, overflow (u32),
//	                   cqes[ring_entries] (16 bytes each: user_data u64, res s32, flags u32)
//	offset 0x10000000  SQE array: ring_entries entries of 64 bytes, or 128 with
//	                   IORING_SETUP_SQE128 (the last 80 bytes are then a command area)
//
// An SQE, little-endian as the host:
//
//	 0 opcode u8 | 1 flags u8 | 2 ioprio u16 | 4 fd s32
//	 8 off u64 (URING_CMD: cmd_op u32 at 8)
//	16 addr u64 | 24 len u32 | 28 op flags u32 | 32 user_data u64
//	40 buf_index u16 | 42 personality u16 | 44 splice_fd_in s32
//	48 addr3 u64 | 56 pad u64          (SQE128: 48..127 is the 80-byte command area)
//
// The application owns the SQ tail and the CQ head; the kernel owns the SQ head and the CQ
// tail. Each side publishes its index with a store-release after writing the entries and
// reads the other's with a load-acquire (Go's sync/atomic gives both).
//
// # Use
//
// A Ring is not safe for concurrent use: one goroutine owns it. A driver that binds a
// command to the submitting task (ublk binds a queue to the thread that fetched its
// requests) needs that goroutine locked to its OS thread (runtime.LockOSThread).
//
//	r, err := uring.New(64, uring.SetupSQE128)
//	sqe, err := r.GetSQE()       // zeroed
//	sqe.PrepURingCmd(fd, op)     // or PrepNop, PrepRead, PrepWrite
//	sqe.UserData = 7
//	copy(r.Cmd(sqe), payload)    // SQE128 rings: up to 80 bytes of command
//	_, err = r.SubmitAndWait(1)
//	cqe, ok := r.PeekCQE()       // then r.SeenCQE()
//
// Buffers named by address in an SQE (Addr) must stay reachable and unmoved until the
// completion: Go's heap does not move objects, and callers keep them alive, or use memory
// from unix.Mmap.
package uring
