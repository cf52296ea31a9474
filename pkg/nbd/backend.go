package nbd

import (
	"errors"
	"syscall"
)

// Backend is the block device an export serves. The RAID10 engine implements it; so does
// FileBackend. Its methods are called concurrently, from every connection of the export.
type Backend interface {
	// ReadAt fills p from offset off. A short read is an error.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes p at offset off. When it returns, the data is visible to every later
	// ReadAt, though not necessarily durable.
	WriteAt(p []byte, off int64) (int, error)
	// Size is the size of the device in bytes. It may grow while the export is served (an
	// online expansion): the server reads it at every handshake and for every range check,
	// so it must be cheap (an atomic load). It never shrinks.
	Size() int64
	// Flush makes durable every write that has completed before Flush was called.
	Flush() error
}

// FUAWriter is implemented by a Backend that can make a single write durable more cheaply
// than WriteAt followed by Flush. Without it, a FUA write is served that way.
type FUAWriter interface {
	// WriteAtFUA writes p at off and returns once it is durable.
	WriteAtFUA(p []byte, off int64) (int, error)
}

// Discarder is implemented by a Backend that can drop the contents of a range. Without it,
// NBD_CMD_TRIM is accepted and does nothing (TRIM is advisory).
type Discarder interface {
	// Discard tells the backend that the range is unused; later reads return zeroes or the
	// old data.
	Discard(off, length int64) error
}

// ZeroWriter is implemented by a Backend that can zero a range without being sent zeroes.
// Without it, NBD_CMD_WRITE_ZEROES is served by writing a zeroed buffer.
type ZeroWriter interface {
	// WriteZeroes sets the range to zeroes; later reads return zeroes.
	WriteZeroes(off, length int64) error
}

// errnoOf maps a backend error to the error code of an NBD reply. Only the errors that the
// protocol gives a meaning are passed through; everything else is EIO.
func errnoOf(err error) Errno {
	switch {
	case err == nil:
		return ErrnoNone
	case errors.Is(err, syscall.ENOSPC):
		return ErrnoNoSpc
	case errors.Is(err, syscall.EINVAL):
		return ErrnoInval
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
		return ErrnoPerm
	default:
		return ErrnoIO
	}
}
