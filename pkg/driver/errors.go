package driver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// Sentinel errors of the CSI services. Wrap them with fmt.Errorf("...: %w", ErrX) to say
// which argument or object is at fault; codeOf maps them to gRPC codes at the boundary.
var (
	// ErrInvalidArgument: a request field or StorageClass parameter is missing or invalid.
	ErrInvalidArgument = errors.New("raid10-csi: invalid argument")
	// ErrNotFound: the volume (or node) named does not exist.
	ErrNotFound = errors.New("raid10-csi: not found")
	// ErrAlreadyExists: a volume of that name exists with other parameters.
	ErrAlreadyExists = errors.New("raid10-csi: already exists with other parameters")
	// ErrConflict: the object changed under us (optimistic concurrency); retry.
	ErrConflict = errors.New("raid10-csi: changed concurrently")
	// ErrInsufficientCapacity: the node has not enough free usable space now.
	ErrInsufficientCapacity = errors.New("raid10-csi: insufficient capacity")
	// ErrTopology: the accessibility requirements exclude the only node the volume can be
	// on (a restore or clone stays on its source's node).
	ErrTopology = errors.New("raid10-csi: cannot be provisioned in the accessible topology asked")
	// ErrOutOfRange: the capacity range can never be satisfied (bad range, or larger than the
	// node's whole usable capacity).
	ErrOutOfRange = errors.New("raid10-csi: capacity out of range")
	// ErrOperationInFlight: another operation on the same volume is running.
	ErrOperationInFlight = errors.New("raid10-csi: an operation on this volume is in progress")
	// ErrFailedPrecondition: the volume is not in a state that allows the operation (being
	// deleted, failed).
	ErrFailedPrecondition = errors.New("raid10-csi: failed precondition")
	// ErrNotReady: the node agent has not finished yet; the caller should retry (the
	// operation is idempotent and resumes).
	ErrNotReady = errors.New("raid10-csi: not ready yet")
	// ErrVolumeFailed: the node agent reported the volume Failed.
	ErrVolumeFailed = errors.New("raid10-csi: volume failed")
	// ErrInvalidToken: a ListVolumes starting_token this plugin did not give.
	ErrInvalidToken = errors.New("raid10-csi: invalid starting token")
	// ErrUnimplemented: the service or mode is not built.
	ErrUnimplemented = errors.New("raid10-csi: not implemented")
)

// codeOf maps an error returned by a service to its gRPC code: the driver's sentinels, the
// node data path's (package attach) and the pool's not-found, which the attacher passes
// through. Errors that already carry a gRPC status (from a gRPC dependency) keep their code;
// anything unknown is Internal.
func codeOf(err error) codes.Code {
	switch {
	case err == nil:
		return codes.OK
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, attach.ErrInvalidFrontend):
		return codes.InvalidArgument
	case errors.Is(err, ErrNotFound), errors.Is(err, pool.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, ErrConflict), errors.Is(err, ErrOperationInFlight), errors.Is(err, ErrInvalidToken):
		return codes.Aborted
	case errors.Is(err, ErrInsufficientCapacity), errors.Is(err, ErrTopology):
		return codes.ResourceExhausted
	case errors.Is(err, ErrOutOfRange):
		return codes.OutOfRange
	case errors.Is(err, ErrFailedPrecondition), errors.Is(err, pool.ErrFailedPrecondition), errors.Is(err, attach.ErrFrontendUnavailable),
		errors.Is(err, attach.ErrNotAttached), errors.Is(err, attach.ErrCannotGrow):
		return codes.FailedPrecondition
	case errors.Is(err, ErrNotReady), errors.Is(err, attach.ErrRetired), errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, ErrUnimplemented):
		return codes.Unimplemented
	case errors.Is(err, ErrVolumeFailed):
		return codes.Internal
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Internal
}

// toStatus converts a service error to a gRPC status error, keeping the message.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}
