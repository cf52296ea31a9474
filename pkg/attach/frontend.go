package attach

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/ublk"
)

// Frontend is how a node serves a volume's block device.
type Frontend string

// The frontends.
const (
	// FrontendAuto takes the node's choice (--frontend; auto there: ResolveFrontend).
	FrontendAuto Frontend = "auto"
	// FrontendNBD serves the volume on /dev/nbdX through the kernel's nbd client.
	FrontendNBD Frontend = "nbd"
	// FrontendUblk serves it on /dev/ublkbN through the kernel's ublk driver (io_uring;
	// Linux 6.0+ with ublk_drv).
	FrontendUblk Frontend = "ublk"
)

// ParseFrontend checks a frontend's name; "" is FrontendAuto.
func ParseFrontend(s string) (Frontend, error) {
	switch f := Frontend(strings.TrimSpace(s)); f {
	case "":
		return FrontendAuto, nil
	case FrontendAuto, FrontendNBD, FrontendUblk:
		return f, nil
	}
	return "", fmt.Errorf("frontend %q: must be auto, nbd or ublk: %w", s, ErrInvalidFrontend)
}

// ResolveFrontend turns the node's --frontend into the one it serves volumes with when a
// volume does not ask. auto is ublk where the running kernel's ublk_drv has every feature a
// volume's operations need (ublk.Required: restarts without an I/O error, and online
// expansion, UPDATE_SIZE of Linux 6.16), NBD elsewhere; the choice, why, and the kernel's
// ublk features are logged once, here. ublk asked for on a kernel without it is an error
// that names the missing piece.
func ResolveFrontend(f Frontend) (Frontend, error) {
	switch f {
	case FrontendAuto, "":
		// Asked once at start, where no request's context exists: GET_FEATURES answers at
		// once, the timeout only bounds a kernel that would not.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		feat, err := kernelUblkFeatures(ctx)
		got, why := autoFrontend(feat, err)
		klog.InfoS("Frontend auto resolved", "frontend", got, "reason", why, "ublkFeatures", feat.String())
		return got, nil
	case FrontendUblk:
		if err := ublk.Available(); err != nil {
			return "", fmt.Errorf("frontend ublk: %w: %w", err, ErrFrontendUnavailable)
		}
	}
	return f, nil
}

// kernelUblkFeatures asks the running kernel's ublk_drv its features (0 and the reason
// when there is no ublk to ask).
func kernelUblkFeatures(ctx context.Context) (ublk.Flags, error) {
	if err := ublk.Available(); err != nil {
		return 0, err
	}
	return ublk.Features(ctx)
}

// autoFrontend is auto's choice for a kernel whose ublk_drv has features f (err: the kernel
// could not be asked, no ublk): ublk when f has all of ublk.Required, else NBD; and why.
func autoFrontend(f ublk.Flags, err error) (Frontend, string) {
	if err != nil {
		return FrontendNBD, fmt.Sprintf("no ublk here (%v)", err)
	}
	if m := f.Missing(ublk.Required); m != 0 {
		return FrontendNBD, fmt.Sprintf("the kernel's ublk_drv lacks %s", m)
	}
	return FrontendUblk, fmt.Sprintf("the kernel's ublk_drv has %s", ublk.Required)
}
