package blockdev

import (
	"errors"
	"syscall"
)

// Backend is the block device a frontend serves. Its methods are called concurrently; the
// package comment states each method's contract.
type Backend interface {
	// ReadAt fills p from offset off. A short read is an error.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes p at offset off. When it returns, the data is visible to every later
	// ReadAt, though not necessarily durable.
	WriteAt(p []byte, off int64) (int, error)
	// Size is the size of the device in bytes. It may grow while the device is served (an
	// online expansion) and never shrinks. Frontends read it for every range check, so it
	// must be cheap (an atomic load).
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
// a discard (TRIM) is accepted and does nothing: it is advisory.
type Discarder interface {
	// Discard tells the backend that the range is unused; later reads return zeroes or the
	// old data.
	Discard(off, length int64) error
}

// ZeroWriter is implemented by a Backend that can zero a range without being sent zeroes.
type ZeroWriter interface {
	// WriteZeroes sets the range to zeroes; later reads return zeroes.
	WriteZeroes(off, length int64) error
}

// meaningful are the errnos a backend error is reduced to, other than EIO.
var meaningful = []syscall.Errno{syscall.ENOSPC, syscall.EOPNOTSUPP, syscall.EROFS, syscall.EPERM, syscall.EINVAL}

// Errno reduces a backend error to the errno a frontend reports: 0 for nil, the first of
// ENOSPC, EOPNOTSUPP, EROFS, EPERM and EINVAL that the error wraps, else EIO.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	for _, e := range meaningful {
		if errors.Is(err, e) {
			return e
		}
	}
	return syscall.EIO
}
