// Package ublk serves a blockdev.Backend (the RAID10 engine; the NBD server serves the same
// interface) as a Linux ublk block device, /dev/ublkbN: the kernel queues block requests in
// shared memory and hands them over io_uring (package uring), one ring and one thread per
// hardware queue, with no socket and no protocol in between. ublk is in Linux 6.0+ (ublk_drv);
// Debian 12's 6.1 kernel is built without it, its 6.12 kernel has it.
//
// # Control
//
// Commands go to /dev/ublk-control as IORING_OP_URING_CMD in a ring of 128-byte SQEs,
// ioctl-encoded (_IOWR('u', nr, struct ublksrv_ctrl_cmd)); the 32-byte struct sits in the
// SQE's command area:
//
//	 0 dev_id u32 | 4 queue_id u16 (0xffff) | 6 len u16 | 8 addr u64 (buffer)
//	16 data u64 (START_DEV, END_USER_RECOVERY: the server's pid) | 24 dev_path_len u16, pad
//
// ADD_DEV (addr: struct ublksrv_ctrl_dev_info, 64 bytes: queues, depth, state, max I/O
// bytes, id, server pid, flags, server flags), SET_PARAMS (struct ublk_params: basic and
// discard parts), START_DEV (waits until every queue has fetched all its requests),
// STOP_DEV, DEL_DEV, GET_DEV_INFO, START_USER_RECOVERY and END_USER_RECOVERY. Devices are
// added with UBLK_F_USER_RECOVERY|UBLK_F_USER_RECOVERY_REISSUE and marked "r10c" in their
// server flags (which the kernel keeps), so a restarted node plugin finds its own.
//
// ublk_drv runs no control command inline: it answers io_uring's non-blocking attempt with
// EAGAIN, so each command completes on an io-wq worker after the submission returned. The
// buffer at addr is therefore a pinned heap copy of the caller's (kernelBuf), never the
// caller's variable, which may sit on a goroutine stack that moves while the kernel works.
//
// GET_FEATURES (Features) returns the UBLK_F_* flags the kernel knows: Required names what
// every volume operation needs (the frontend auto of package attach takes ublk only where
// all are there), Report the newer ones a volume's status shows. UPDATE_SIZE (Linux 6.16,
// data: the new size in sectors) changes a started device's size: Device.Resize, for online
// expansion; before 6.16 it is ErrNoResize. Debian 12's 6.12 reports 0x1fe (no
// UPDATE_SIZE), trixie-backports' 7.3 0x1fffff.
//
// # Data path
//
// Per queue q, /dev/ublkcN is mapped read-only at q*round_up(4096*24, page): an array of
// struct ublksrv_io_desc (24 bytes per tag: op and flags u32, sectors u32, start sector
// u64, addr u64). The queue thread sends one FETCH_REQ per tag (struct ublksrv_io_cmd:
// q_id u16, tag u16, result s32, buffer address u64) with the tag's buffer; a completion
// with res 0 means the tag holds a request. Writes arrive in the buffer; a goroutine runs
// the request on the backend and the thread sends COMMIT_AND_FETCH_REQ with the result
// (bytes, or -errno) and the buffer, which completes the request and fetches the tag's next.
// res -ENODEV (UBLK_IO_RES_ABORT) means the tag is finished (the device is stopping).
// REQ_OP_FLUSH becomes the backend's Flush, FUA writes blockdev.FUAWriter (or a write and a
// flush), discard and write-zeroes the backend's blockdev.Discarder and blockdev.ZeroWriter
// (advertised only when present); errors reach the kernel as blockdev.Errno. The kernel binds a queue to the thread that fetched for it, so each queue
// goroutine stays locked to its OS thread and that thread ends with it.
//
// # Zero copy
//
// Where the kernel has UBLK_F_AUTO_BUF_REG (6.16+; Debian's 7.3) and the backend has ring
// queues (the engine), Create adds the device with it (Options.NoZeroCopy keeps the copying
// path; Recover keeps what the device was added with; Device.ZeroCopy says which, the "ublk
// device started" log line and a volume's status.frontend say "zero copy"). Each queue
// thread registers a sparse fixed-buffer table of depth slots on its ring, and every FETCH
// and COMMIT_AND_FETCH names slot tag in the SQE's own addr (struct ublk_auto_buf_reg: index
// in bits 0-15, flags 16-23; the command's addr is then 0, which the kernel requires): the
// kernel puts the fetched request's pages in that slot before it completes the fetch, and
// takes them out at the commit, completing the request only once the commit has come and
// every I/O that uses the slot has ended. No data is copied into the tag's buffer, for any
// request.
//
// A read or plain write that the engine's fast path takes goes to the members as READ_FIXED
// or WRITE_FIXED on that slot (raid10's ReadFixed/WriteFixed): no copy at all. That path
// takes requests within one chunk, so a zero-copy device's chunk_sectors is the engine's
// chunk (a backend's ChunkSize): the block layer splits a 1 MiB request over 512 KiB chunks
// into two, each zero-copy. Everything
// else copies on the ring: the tags' buffers are a memfd's pages, a write's data is brought
// in with a WRITE_FIXED from the slot to the memfd at the tag's offset before the request is
// served as before, a read's data goes out with a READ_FIXED from the memfd into the slot
// before its commit. So FUA writes, flushes, discards, requests over a chunk, requests under
// QoS limits or a barrier, and zero-copy requests that failed (a member error on a read, or
// a slot the member's direct I/O refuses, EINVAL/EFAULT: the engine ends them through a
// retry and they are served again the copying way, whose rules recover them) keep every
// promise of the copying path. The member deadline does not abandon a zero-copy member I/O:
// the kernel would hold its request until that I/O ended anyway (its pages are the
// request's); the member is failed as before, so later requests avoid it, and the requests
// already on it wait for the device's own completion.
//
// No UBLK_AUTO_BUF_REG_FALLBACK: slot tag is always free at a fetch (the commit before
// emptied it), so the kernel's registration fails only for want of memory, and the kernel
// then fails that request with an I/O error; with the fallback the server would have to
// register the buffer itself (UBLK_U_IO_REGISTER_IO_BUF and its unregistering), for a case
// that does not arise otherwise. A device added with zero copy can be recovered only by a
// server that knows it (an older plugin's fetches carry a buffer address, which the kernel
// refuses): a rollback of the node plugin past this change needs the volume restaged.
//
// # Restart
//
// When the serving process dies (kill -9) or detaches, the kernel cancels its fetch
// commands, requeues the requests it had not completed, quiesces the device and keeps new
// I/O queued: no error and no timeout. Recover in a new process sends START_USER_RECOVERY
// (refused with EBUSY until the old process's /dev/ublkcN is closed), fetches every tag
// again and sends END_USER_RECOVERY; the queued requests are then issued to it.
package ublk
