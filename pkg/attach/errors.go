package attach

import "errors"

// Sentinel errors of the data path. A volume the pool does not have is the pool's
// pool.ErrNotFound, passed through. The CSI driver maps these to gRPC codes.
var (
	// ErrInvalidFrontend: a frontend name other than auto, nbd or ublk.
	ErrInvalidFrontend = errors.New("attach: unknown frontend")
	// ErrFrontendUnavailable: the frontend asked for cannot serve on this node (ublk not
	// enabled here, or a kernel without ublk_drv).
	ErrFrontendUnavailable = errors.New("attach: frontend unavailable on this node")
	// ErrNotAttached: the volume is not attached by this process (not staged here).
	ErrNotAttached = errors.New("attach: volume not attached here")
	// ErrCannotGrow: the volume's device cannot follow its grown array while it is served
	// (a ublk device before Linux 6.16); it grows when the volume is attached again.
	ErrCannotGrow = errors.New("attach: device cannot grow while served")
	// ErrRetired: this process handed its devices to a successor, which serves them now; the
	// caller retries and reaches the successor.
	ErrRetired = errors.New("attach: this node plugin handed its volumes to its successor")
)
