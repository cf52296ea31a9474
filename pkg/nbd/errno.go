package nbd

import (
	"syscall"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// errnoOf maps a backend error to the error code of an NBD reply. Only the errors that the
// protocol gives a meaning are passed through; everything else (EOPNOTSUPP included) is EIO.
func errnoOf(err error) Errno {
	if err == nil {
		return ErrnoNone
	}
	switch blockdev.Errno(err) {
	case syscall.ENOSPC:
		return ErrnoNoSpc
	case syscall.EINVAL:
		return ErrnoInval
	case syscall.EPERM, syscall.EROFS:
		return ErrnoPerm
	default:
		return ErrnoIO
	}
}
