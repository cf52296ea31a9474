package attach

import (
	"fmt"
	"strings"

	"github.com/raid10-csi/raid10-csi/pkg/ublk"
)

// Frontend is how a node serves a volume's block device.
type Frontend string

// The frontends.
const (
	// FrontendAuto takes the node's choice (--frontend).
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
// volume does not ask: auto is NBD. ublk passes its VM tests (stage, kill -9 and graceful
// restarts of the plugin under fio verification), but a ublk device cannot grow while it is
// served (Linux 6.16's UPDATE_SIZE is needed), so auto keeps online expansion by staying on
// NBD; a StorageClass or --frontend=ublk asks for ublk (csi-sanity passes over it:
// RAID10_SANITY_UBLK=1 in test/sanity).
// ublk asked for on a kernel without it is an error that names the missing piece.
func ResolveFrontend(f Frontend) (Frontend, error) {
	switch f {
	case FrontendAuto, "":
		return FrontendNBD, nil
	case FrontendUblk:
		if err := ublk.Available(); err != nil {
			return "", fmt.Errorf("frontend ublk: %w: %w", err, ErrFrontendUnavailable)
		}
	}
	return f, nil
}
