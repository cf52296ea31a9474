package nbd

import "github.com/raid10-csi/raid10-csi/pkg/blockdev"

// VolumeBlockSize is the I/O granularity of a RAID10 volume: the engine refuses requests
// that are not aligned to it.
const VolumeBlockSize = 4096

// NewVolumeServer returns a server with one default export ("") serving a volume's array:
// the export that the standalone agent (kubectl-raid10 local serve, on a unix socket) and the
// CSI node service (through the kernel attach) both serve. It advertises VolumeBlockSize as
// the minimum block size, so that clients align their requests.
func NewVolumeServer(volume string, b blockdev.Backend) (*Server, error) {
	return NewServer(Options{MinBlockSize: VolumeBlockSize},
		Export{Name: "", Description: "raid10 volume " + volume, Backend: b})
}
