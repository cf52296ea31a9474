package pool

import "errors"

// Sentinel errors. Every error the pool returns wraps one of these (or *SignatureError,
// which matches ErrForeignSignature), so callers map them to gRPC codes with errors.Is once
// at their boundary:
//
//	ErrInvalidArgument   InvalidArgument
//	ErrNotFound          NotFound
//	ErrAlreadyExists     AlreadyExists (same name, other parameters)
//	ErrNoSpace           ResourceExhausted / OutOfRange
//	ErrFailedPrecondition, ErrForeignSignature, ErrCorruptLabel, ErrLabelUnreadable,
//	ErrOtherPool, ErrMixedPools, ErrDiskInUse, ErrDegraded
//	                     FailedPrecondition
var (
	ErrInvalidArgument    = errors.New("pool: invalid argument")
	ErrNotFound           = errors.New("pool: not found")
	ErrAlreadyExists      = errors.New("pool: already exists with other parameters")
	ErrNoSpace            = errors.New("pool: not enough free space")
	ErrFailedPrecondition = errors.New("pool: failed precondition")
	ErrForeignSignature   = errors.New("pool: disk carries a foreign signature")
	ErrCorruptLabel       = errors.New("pool: corrupt pool label")
	ErrLabelVersion       = errors.New("pool: pool label version not supported")
	// ErrLabelUnreadable: reading the label area failed (an I/O error), so the disk is
	// neither known to be blank nor known to be ours; it is refused, never claimed.
	ErrLabelUnreadable = errors.New("pool: pool label unreadable")
	ErrOtherPool       = errors.New("pool: disk belongs to another pool")
	ErrMixedPools      = errors.New("pool: disks of more than one pool offered")
	ErrDiskInUse       = errors.New("pool: disk in use by another process")
	ErrDegraded        = errors.New("pool: volume not healthy")
	ErrClosed          = errors.New("pool: closed")
)
