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
// # Restart
//
// When the serving process dies (kill -9) or detaches, the kernel cancels its fetch
// commands, requeues the requests it had not completed, quiesces the device and keeps new
// I/O queued: no error and no timeout. Recover in a new process sends START_USER_RECOVERY
// (refused with EBUSY until the old process's /dev/ublkcN is closed), fetches every tag
// again and sends END_USER_RECOVERY; the queued requests are then issued to it.
package ublk
