package pool

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// blkDiscard is BLKDISCARD, _IO(0x12, 119).
const blkDiscard = 0x1277

func ioctlBlkDiscard(fd uintptr, r *[2]uint64) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, blkDiscard, uintptr(unsafe.Pointer(r)))
	if errno != 0 {
		return errno
	}
	return nil
}
