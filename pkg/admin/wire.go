package admin

import (
	"errors"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// ErrorCodes names the pool's sentinels on the wire, so the client side gets errors that
// match them with errors.Is again.
var ErrorCodes = []struct {
	Code string
	Err  error
}{
	{"InvalidArgument", pool.ErrInvalidArgument},
	{"NotFound", pool.ErrNotFound},
	{"AlreadyExists", pool.ErrAlreadyExists},
	{"NoSpace", pool.ErrNoSpace},
	{"ForeignSignature", pool.ErrForeignSignature},
	{"CorruptLabel", pool.ErrCorruptLabel},
	{"LabelUnreadable", pool.ErrLabelUnreadable},
	{"OtherPool", pool.ErrOtherPool},
	{"DiskInUse", pool.ErrDiskInUse},
	{"Degraded", pool.ErrDegraded},
	{"FailedPrecondition", pool.ErrFailedPrecondition},
	{"Closed", pool.ErrClosed},
}

// wireError is an error as it crosses the socket.
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// codeOf names err's sentinel; "Internal" for none.
func codeOf(err error) string {
	for _, c := range ErrorCodes {
		if errors.Is(err, c.Err) {
			return c.Code
		}
	}
	return "Internal"
}

func (w wireError) err() error {
	for _, c := range ErrorCodes {
		if c.Code == w.Code {
			return &remoteError{msg: w.Message, sentinel: c.Err}
		}
	}
	return errors.New(w.Message)
}

// remoteError is an error the server returned: its message as the server wrote it,
// matching the pool sentinel its code names.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }

// Is makes errors.Is(err, pool.ErrX) work across the admin socket.
func (e *remoteError) Is(target error) bool { return target == e.sentinel }
