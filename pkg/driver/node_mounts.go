package driver

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
)

// MountTable tells which mounts still use a block device: NodeUnstageVolume refuses to
// detach a device while any remains, whatever became of the staging path.
type MountTable interface {
	// MountsOf returns the mount points of every filesystem on dev and of every bind of
	// dev's device node itself (a published Block volume), in mount-table order. A dev that
	// does not exist has none.
	MountsOf(dev string) ([]string, error)
}

// MountInfo is the kernel's mount table of this process's mount namespace, read from a
// mountinfo file (/proc/self/mountinfo). Devices are matched by major:minor, never by the
// name in the table's source column: a mount made through another path to the same device
// (a symlink under /dev/disk, a container's own /dev) still counts.
type MountInfo struct {
	// Path is the mountinfo file; empty: /proc/self/mountinfo.
	Path string
}

var _ MountTable = MountInfo{}

// MountsOf implements MountTable. A filesystem mounted from dev carries dev's major:minor in
// the table. A bind of the device node (mount --bind /dev/nbd0 FILE) carries the numbers of
// the filesystem holding the node instead (devtmpfs), so for mounts of devtmpfs and tmpfs
// (the filesystems /dev is made of) the mount point itself is looked at: a block device
// node with dev's numbers is such a bind. No other mount point is stat'ed, so a hung
// network filesystem cannot stall the call.
func (m MountInfo) MountsOf(dev string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil, fmt.Errorf("%s is not a block device: %w", dev, ErrInvalidArgument)
	}
	path := m.Path
	if path == "" {
		path = "/proc/self/mountinfo"
	}
	mis, err := mount.ParseMountInfo(path)
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	major, minor := int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
	var out []string
	for _, mi := range mis {
		if mi.Major == major && mi.Minor == minor {
			out = append(out, mi.MountPoint)
			continue
		}
		if mi.FsType != "devtmpfs" && mi.FsType != "tmpfs" {
			continue
		}
		var mp unix.Stat_t
		if unix.Stat(mi.MountPoint, &mp) == nil && mp.Mode&unix.S_IFMT == unix.S_IFBLK && mp.Rdev == st.Rdev {
			out = append(out, mi.MountPoint)
		}
	}
	return out, nil
}
