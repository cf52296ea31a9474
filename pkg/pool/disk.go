package pool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// diskFile is an open, exclusively locked disk: a block device or a regular file, or the
// member that Config.OpenDisk returned for the path.
type diskFile struct {
	path    string // as configured (after glob expansion)
	real    string // symlinks resolved
	f       labelIO
	mem     raid10.Member // the disk of Config.OpenDisk; nil for a device or a file
	memBase bool          // mem is the disk's data path now (openBase): closed with it
	size    int64
	isBlock bool
	ident   Identity
}

// Identity is how the hardware names a disk, so that a disk that moves to another /dev name
// is still recognised. Files have none.
type Identity struct {
	// WWN is the World Wide Name (sysfs wwid), "" when the device has none.
	WWN string `json:"wwn,omitempty"`
	// Serial is the device serial number, "" when the device has none.
	Serial string `json:"serial,omitempty"`
	// ByID is the /dev/disk/by-id link that names the device, preferring wwn-*.
	ByID string `json:"byID,omitempty"`
}

// String is the identity kept in the pool's disk table: WWN, else serial, else "".
func (i Identity) String() string {
	switch {
	case i.WWN != "":
		return i.WWN
	case i.Serial != "":
		return i.Serial
	}
	return ""
}

// labelIO is what labels and signatures are read and written through: the disk's *os.File,
// or the member of Config.OpenDisk.
type labelIO interface {
	io.ReaderAt
	io.WriterAt
}

// openDisk opens path through Config.OpenDisk when it is set, else as openDiskFile does.
func (p *Pool) openDisk(path string) (*diskFile, error) {
	if p.cfg.OpenDisk == nil {
		return openDiskFile(path)
	}
	m, err := p.cfg.OpenDisk(path)
	if err != nil {
		return nil, fmt.Errorf("pool: open disk %s: %w", path, err)
	}
	return &diskFile{path: path, real: path, f: m, mem: m, size: m.Size()}, nil
}

// openDiskFile opens path read-write and takes an exclusive, non-blocking flock on it (and
// O_EXCL for block devices, which the kernel refuses while the device is mounted or held).
func openDiskFile(path string) (*diskFile, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("%w: disk %s: %w", ErrNotFound, path, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("%w: disk %s: %w", ErrNotFound, path, err)
	}
	d := &diskFile{path: path, real: real}
	flags := os.O_RDWR
	switch {
	case st.Mode().IsRegular():
	case st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0:
		d.isBlock = true
		flags |= os.O_EXCL
	default:
		return nil, fmt.Errorf("%w: disk %s is neither a block device nor a regular file", ErrInvalidArgument, path)
	}
	f, err := os.OpenFile(real, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("%w: disk %s: %w", ErrDiskInUse, path, err)
		}
		return nil, fmt.Errorf("pool: open disk %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%w: disk %s is locked by another process: %w", ErrDiskInUse, path, err)
	}
	d.f = f
	if d.isBlock {
		d.size, err = f.Seek(0, io.SeekEnd)
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("pool: size of disk %s: %w", path, err)
		}
		d.ident = blockIdentity(real)
	} else {
		d.size = st.Size()
	}
	return d, nil
}

func (d *diskFile) close() error {
	if d.mem != nil {
		if d.memBase {
			return nil // the data path closes it
		}
		return d.mem.Close()
	}
	return d.osFile().Close()
}

// osFile is the *os.File of a device or a file (not of a Config.OpenDisk member).
func (d *diskFile) osFile() *os.File { return d.f.(*os.File) }

// unlock releases the lock openDisk took (openBase moves it to the data path). A member of
// Config.OpenDisk has no lock.
func (d *diskFile) unlock() error {
	if d.mem != nil {
		return nil
	}
	return unix.Flock(int(d.osFile().Fd()), unix.LOCK_UN)
}

// Where blockIdentity looks; tests point them at a fake tree.
var (
	sysClassBlock = "/sys/class/block"
	devDiskByID   = "/dev/disk/by-id"
)

// blockIdentity reads the WWN and serial of a block device from sysfs (NVMe and virtio
// keep them on the block device, SCSI/SATA on its device) and finds its /dev/disk/by-id
// name. Missing attributes are left empty.
func blockIdentity(devPath string) Identity {
	name := filepath.Base(devPath)
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	sys := filepath.Join(sysClassBlock, name)
	id := Identity{
		WWN:    firstNonEmpty(read(filepath.Join(sys, "wwid")), read(filepath.Join(sys, "device", "wwid"))),
		Serial: firstNonEmpty(read(filepath.Join(sys, "device", "serial")), read(filepath.Join(sys, "serial"))),
	}
	links, _ := filepath.Glob(filepath.Join(devDiskByID, "*"))
	for _, l := range links {
		if t, err := filepath.EvalSymlinks(l); err == nil && t == devPath {
			if id.ByID == "" || strings.HasPrefix(filepath.Base(l), "wwn-") {
				id.ByID = l
			}
		}
	}
	return id
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// wipeSignatures zeroes the places where the signatures DetectSignatures knows live: the
// first LabelAreaSize bytes and the last probeTail bytes (md 0.90/1.0, GPT backup). It is
// only called for a disk whose configuration opts in to wiping.
func (d *diskFile) wipeSignatures() error {
	zero := make([]byte, LabelAreaSize)
	if _, err := d.f.WriteAt(zero[:min(d.size, LabelAreaSize)], 0); err != nil {
		return fmt.Errorf("pool: wipe head of %s: %w", d.path, err)
	}
	if off := max(0, d.size-probeTail); off > 0 {
		if _, err := d.f.WriteAt(zero[:d.size-off], off); err != nil {
			return fmt.Errorf("pool: wipe tail of %s: %w", d.path, err)
		}
	}
	return d.sync()
}

func (d *diskFile) sync() error {
	sync := d.osFileSync
	if d.mem != nil {
		sync = d.mem.Flush
	}
	if err := sync(); err != nil {
		return fmt.Errorf("pool: sync %s: %w", d.path, err)
	}
	return nil
}

func (d *diskFile) osFileSync() error { return d.osFile().Sync() }

// writeLabelSlot writes an encoded label into slot s and makes it durable before it
// returns.
func (d *diskFile) writeLabelSlot(s int, b []byte) error {
	if _, err := d.f.WriteAt(b, int64(s)*LabelSlotSize); err != nil {
		return fmt.Errorf("pool: write label slot %d of %s: %w", s, d.path, err)
	}
	return d.sync()
}

// discard releases a byte range: punch a hole in a file, BLKDISCARD on a device. Errors
// are returned but callers treat them as advisory.
func (d *diskFile) discard(off, length int64) error {
	if d.mem != nil {
		return d.mem.Discard(off, length)
	}
	if d.isBlock {
		r := [2]uint64{uint64(off), uint64(length)}
		if err := ioctlBlkDiscard(d.osFile().Fd(), &r); err != nil {
			return fmt.Errorf("pool: discard %s [%d, +%d): %w", d.path, off, length, err)
		}
		return nil
	}
	if err := unix.Fallocate(int(d.osFile().Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length); err != nil {
		return fmt.Errorf("pool: punch hole in %s [%d, +%d): %w", d.path, off, length, err)
	}
	return nil
}
