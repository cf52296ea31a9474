package nbd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// FileBackend serves a regular file (or a block device node) as a blockdev.Backend. It is meant for
// tests and benchmarks, and as the reference against which the RAID10 engine is measured.
// Discard punches holes, WriteZeroes zeroes a range with fallocate, Flush is fdatasync and
// FUA writes use pwritev2 with RWF_DSYNC.
type FileBackend struct {
	f    *os.File
	size int64
}

var (
	_ blockdev.Backend    = (*FileBackend)(nil)
	_ blockdev.FUAWriter  = (*FileBackend)(nil)
	_ blockdev.Discarder  = (*FileBackend)(nil)
	_ blockdev.ZeroWriter = (*FileBackend)(nil)
)

// OpenFileBackend opens path read-write. When size is positive the file is created if
// missing and truncated or extended to size; otherwise the current size is served.
func OpenFileBackend(path string, size int64) (*FileBackend, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("nbd: open backend file: %w", err)
	}
	if size > 0 {
		if err := f.Truncate(size); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("nbd: size backend file: %w", err)
		}
	}
	end, err := f.Seek(0, 2)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("nbd: size of backend file: %w", err)
	}
	return &FileBackend{f: f, size: end}, nil
}

// ReadAt implements blockdev.Backend.
func (b *FileBackend) ReadAt(p []byte, off int64) (int, error) { return b.f.ReadAt(p, off) }

// WriteAt implements blockdev.Backend.
func (b *FileBackend) WriteAt(p []byte, off int64) (int, error) { return b.f.WriteAt(p, off) }

// Size implements blockdev.Backend.
func (b *FileBackend) Size() int64 { return b.size }

// Flush implements blockdev.Backend.
func (b *FileBackend) Flush() error { return unix.Fdatasync(int(b.f.Fd())) }

// WriteAtFUA implements blockdev.FUAWriter.
func (b *FileBackend) WriteAtFUA(p []byte, off int64) (int, error) {
	n, err := unix.Pwritev2(int(b.f.Fd()), [][]byte{p}, off, unix.RWF_DSYNC)
	if err == nil && n < len(p) {
		err = unix.EIO
	}
	return n, err
}

// Discard implements blockdev.Discarder.
func (b *FileBackend) Discard(off, length int64) error {
	err := unix.Fallocate(int(b.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	if err == unix.EOPNOTSUPP {
		return nil // TRIM is advisory.
	}
	return err
}

// WriteZeroes implements blockdev.ZeroWriter.
func (b *FileBackend) WriteZeroes(off, length int64) error {
	err := unix.Fallocate(int(b.f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	if err == unix.EOPNOTSUPP {
		err = unix.Fallocate(int(b.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	}
	return err
}

// Close closes the file.
func (b *FileBackend) Close() error { return b.f.Close() }
