package raid10

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"k8s.io/klog/v2"
)

// Member is one leg of the array: a file, a block device or a sub-range of
// one. Implementations must be safe for concurrent use. Offsets and lengths
// passed by the array are multiples of BlockSize; buffers may or may not be
// BlockSize-aligned in memory (a direct-I/O member bounces unaligned ones).
type Member interface {
	// ReadAt reads len(p) bytes at off; a short read is an error.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes len(p) bytes at off; a short write is an error.
	WriteAt(p []byte, off int64) (int, error)
	// Flush makes every completed write durable (fdatasync / cache flush).
	Flush() error
	// Discard tells the member the range is unused; its contents afterwards
	// are unspecified (zero on files, whatever the device returns otherwise).
	Discard(off, length int64) error
	// WriteZeroes makes the range read back as zeroes, without necessarily
	// writing them (FALLOC_FL_ZERO_RANGE, BLKZEROOUT).
	WriteZeroes(off, length int64) error
	// Size is the member's usable size in bytes.
	Size() int64
	// Close releases the member. The array closes its members in Close.
	Close() error
}

var (
	_ Member = (*FileMember)(nil)
	_ Member = (*ExtentMember)(nil)
	_ Member = (*MemMember)(nil)
	_ Member = (*FaultyMember)(nil)
)

// BlockSize is the unit of every array and member request: offsets and
// lengths must be multiples of it. 4096 so that direct I/O works on 4Kn
// devices; the NBD server advertises it as the block size.
const BlockSize = 4096

// AlignedBuffer returns a zeroed n-byte slice whose first byte is
// BlockSize-aligned, usable for direct I/O.
func AlignedBuffer(n int) []byte {
	b := make([]byte, n+BlockSize)
	o := int(uintptr(unsafe.Pointer(&b[0])) & (BlockSize - 1))
	if o != 0 {
		o = BlockSize - o
	}
	return b[o : o+n : o+n]
}

func isAligned(p []byte) bool {
	return len(p) == 0 || uintptr(unsafe.Pointer(&p[0]))&(BlockSize-1) == 0
}

// bounce pools hold aligned buffers for direct I/O on unaligned memory, one
// pool per power of two from 4 KiB to 1 MiB. Larger requests allocate.
var bouncePools [9]sync.Pool

func getBounce(n int) *[]byte {
	cls, sz := 0, BlockSize
	for sz < n {
		sz <<= 1
		cls++
	}
	if cls >= len(bouncePools) {
		b := AlignedBuffer(n)
		return &b
	}
	if v := bouncePools[cls].Get(); v != nil {
		return v.(*[]byte)
	}
	b := AlignedBuffer(sz)
	return &b
}

func putBounce(b *[]byte) {
	sz := cap(*b)
	cls, s := 0, BlockSize
	for s < sz {
		s <<= 1
		cls++
	}
	if s == sz && cls < len(bouncePools) {
		bouncePools[cls].Put(b)
	}
}

// FileMember is a regular file or a block device, opened with O_DIRECT
// where the file system supports it. Where it does not (tmpfs before Linux
// 6.6, some FUSE and network file systems) the open fails with EINVAL; the
// member then falls back to buffered I/O, logs it, and Direct reports false.
// Flush makes the data durable with fdatasync either way.
type FileMember struct {
	f  *os.File
	fd int // f's descriptor, for ring I/O (queue.go)
	// Ring I/O names the descriptor, not the *os.File: ringRefs counts the
	// ring requests between ringTarget and ringDone (ringClosing set once
	// Close was called), and the descriptor is closed only when none is
	// left, so that it is never closed (and its number reused by another
	// open) under a prepared or running request. Like os.File's own
	// reference count, Close does not wait for a request stuck in a device.
	ringRefs atomic.Int64
	path     string
	size     int64
	direct   bool
	block    bool
}

// OpenFileMember opens path (a regular file or a block device) read-write
// for use as a member. A regular file must already have its final size.
func OpenFileMember(path string) (*FileMember, error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0)
	direct := true
	if errors.Is(err, syscall.EINVAL) {
		klog.InfoS("O_DIRECT not supported, using buffered I/O", "member", path)
		direct = false
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("raid10: open member %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("raid10: stat member %s: %w", path, err)
	}
	m := &FileMember{f: f, fd: int(f.Fd()), path: path, direct: direct}
	if fi.Mode()&os.ModeDevice != 0 {
		m.block = true
		end, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("raid10: size of %s: %w", path, err)
		}
		m.size = end
	} else {
		m.size = fi.Size()
	}
	m.size &^= BlockSize - 1
	return m, nil
}

// Fd is the descriptor of the member's open file, for a caller that registers it (io_uring)
// or holds the open file (a duplicate keeps it, and LockExclusive's lock, alive). It is
// valid until Close.
func (m *FileMember) Fd() int { return m.fd }

// LockExclusive takes an exclusive, non-blocking flock on the member's own open file, or
// returns the flock error (EWOULDBLOCK while another open file of the same file or device
// holds one). The kernel keeps such a lock with the open file, not with the descriptor: it is
// released only when the file is released, that is after Close and after the last call still
// in flight on it has returned (a read or write stuck in a hung device, a ring request),
// even past the exit of the process. Another process that takes the same lock before it
// opens the device therefore never opens it while a write of ours can still land there.
func (m *FileMember) LockExclusive() error {
	return syscall.Flock(m.fd, syscall.LOCK_EX|syscall.LOCK_NB)
}

// ringClosing is the bit of FileMember.ringRefs that Close sets.
const ringClosing = 1 << 62

// ringTarget implements ringMember.
func (m *FileMember) ringTarget(off, n int64) (int, int64, bool) {
	if !m.direct {
		return 0, 0, false
	}
	for {
		v := m.ringRefs.Load()
		if v&ringClosing != 0 {
			return 0, 0, false
		}
		if m.ringRefs.CompareAndSwap(v, v+1) {
			return m.fd, off, true
		}
	}
}

// ringDone implements ringMember; the last hold of a closed member closes
// its file.
func (m *FileMember) ringDone() {
	if m.ringRefs.Add(-1) == ringClosing {
		if err := m.f.Close(); err != nil {
			klog.ErrorS(err, "raid10: closing a member after its last ring request", "member", m.path)
		}
	}
}

// Path is the path the member was opened from.
func (m *FileMember) Path() string { return m.path }

// Direct reports whether the member uses O_DIRECT.
func (m *FileMember) Direct() bool { return m.direct }

// ReadAt implements Member.
func (m *FileMember) ReadAt(p []byte, off int64) (int, error) {
	if !m.direct || isAligned(p) {
		return m.f.ReadAt(p, off)
	}
	b := getBounce(len(p))
	n, err := m.f.ReadAt((*b)[:len(p)], off)
	copy(p, (*b)[:n])
	putBounce(b)
	return n, err
}

// WriteAt implements Member.
func (m *FileMember) WriteAt(p []byte, off int64) (int, error) {
	if !m.direct || isAligned(p) {
		return m.f.WriteAt(p, off)
	}
	b := getBounce(len(p))
	copy(*b, p)
	n, err := m.f.WriteAt((*b)[:len(p)], off)
	putBounce(b)
	return n, err
}

// Flush implements Member with fdatasync.
func (m *FileMember) Flush() error {
	if err := syscall.Fdatasync(int(m.f.Fd())); err != nil {
		return fmt.Errorf("raid10: flush %s: %w", m.path, err)
	}
	return nil
}

const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
	ioctlBlkDiscard = 0x1277
	ioctlBlkZeroout = 0x127f
)

func (m *FileMember) ioctlRange(req uintptr, off, length int64) error {
	r := [2]uint64{uint64(off), uint64(length)}
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.f.Fd(), req, uintptr(unsafe.Pointer(&r[0])))
	if e != 0 {
		return e
	}
	return nil
}

// Discard implements Member: punch a hole in a file, BLKDISCARD on a device.
func (m *FileMember) Discard(off, length int64) error {
	var err error
	if m.block {
		err = m.ioctlRange(ioctlBlkDiscard, off, length)
	} else {
		err = syscall.Fallocate(int(m.f.Fd()), fallocPunchHole|fallocKeepSize, off, length)
	}
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return nil // discard is a hint
	}
	return err
}

// WriteZeroes implements Member: FALLOC_FL_ZERO_RANGE (or a punched hole)
// on a file, BLKZEROOUT on a device, zero writes where neither works.
func (m *FileMember) WriteZeroes(off, length int64) error {
	var err error
	if m.block {
		err = m.ioctlRange(ioctlBlkZeroout, off, length)
	} else {
		err = syscall.Fallocate(int(m.f.Fd()), fallocZeroRange|fallocKeepSize, off, length)
		if err != nil {
			err = syscall.Fallocate(int(m.f.Fd()), fallocPunchHole|fallocKeepSize, off, length)
		}
	}
	if err == nil {
		return nil
	}
	return writeZeroesSlow(m, off, length)
}

func writeZeroesSlow(m Member, off, length int64) error {
	b := getBounce(1 << 20)
	defer putBounce(b)
	z := *b
	clear(z)
	for length > 0 {
		n := min(length, int64(len(z)))
		if _, err := m.WriteAt(z[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// Size implements Member.
func (m *FileMember) Size() int64 { return m.size }

// Close implements Member.
func (m *FileMember) Close() error {
	for {
		v := m.ringRefs.Load()
		if v&ringClosing != 0 {
			return os.ErrClosed
		}
		if !m.ringRefs.CompareAndSwap(v, v|ringClosing) {
			continue
		}
		if v != 0 {
			return nil // the last ring request closes it (ringDone)
		}
		return m.f.Close()
	}
}

// ExtentMember is the byte range [off, off+length) of a base member, seen as
// a member of its own: the pool builds one array per volume over one extent
// per disk. Close does not close the base (the pool owns it).
type ExtentMember struct {
	base   Member
	off    int64
	length atomic.Int64 // Resize changes it under running I/O
}

// NewExtentMember returns the extent [off, off+length) of base. off and
// length must be multiples of BlockSize and lie inside base.
func NewExtentMember(base Member, off, length int64) (*ExtentMember, error) {
	if off < 0 || length <= 0 || off%BlockSize != 0 || length%BlockSize != 0 || off+length > base.Size() {
		return nil, invalidf("extent [%d,+%d) of a %d-byte member", off, length, base.Size())
	}
	e := &ExtentMember{base: base, off: off}
	e.length.Store(length)
	return e, nil
}

// Resize sets the extent's length (a multiple of BlockSize, > 0); the range
// [off, off+length) must stay inside the base. It is safe under concurrent
// I/O: the length is an atomic value every access checks. Growing is what
// Array.Grow needs; shrinking below what an array uses makes its I/O there
// fail.
func (e *ExtentMember) Resize(length int64) error {
	if length <= 0 || length%BlockSize != 0 || e.off+length > e.base.Size() {
		return invalidf("extent [%d,+%d) of a %d-byte member", e.off, length, e.base.Size())
	}
	e.length.Store(length)
	return nil
}

func (e *ExtentMember) check(off, n int64) error {
	if l := e.length.Load(); off < 0 || off+n > l {
		return invalidf("extent access [%d,+%d) beyond %d", off, n, l)
	}
	return nil
}

// ReadAt implements Member.
func (e *ExtentMember) ReadAt(p []byte, off int64) (int, error) {
	if err := e.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	return e.base.ReadAt(p, e.off+off)
}

// WriteAt implements Member.
func (e *ExtentMember) WriteAt(p []byte, off int64) (int, error) {
	if err := e.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	return e.base.WriteAt(p, e.off+off)
}

// ringTarget implements ringMember: the base's descriptor at the extent's offset.
func (e *ExtentMember) ringTarget(off, n int64) (int, int64, bool) {
	b, ok := e.base.(ringMember)
	if !ok || e.check(off, n) != nil {
		return 0, 0, false
	}
	return b.ringTarget(e.off+off, n)
}

// ringDone implements ringMember.
func (e *ExtentMember) ringDone() { e.base.(ringMember).ringDone() }

// Flush implements Member (flushes the whole base).
func (e *ExtentMember) Flush() error { return e.base.Flush() }

// Discard implements Member.
func (e *ExtentMember) Discard(off, length int64) error {
	if err := e.check(off, length); err != nil {
		return err
	}
	return e.base.Discard(e.off+off, length)
}

// WriteZeroes implements Member.
func (e *ExtentMember) WriteZeroes(off, length int64) error {
	if err := e.check(off, length); err != nil {
		return err
	}
	return e.base.WriteZeroes(e.off+off, length)
}

// Size implements Member.
func (e *ExtentMember) Size() int64 { return e.length.Load() }

// Close implements Member; the base stays open.
func (e *ExtentMember) Close() error { return nil }

// MemMember is a member in memory, for tests and examples. Its contents
// survive Close, so a test can assemble it again. It takes no lock: as on a
// disk, concurrent requests to overlapping ranges give undefined contents
// (and are reported by the race detector, which tests use to prove the
// array never issues them).
type MemMember struct {
	data []byte
}

// NewMemMember returns a zeroed in-memory member of size bytes.
func NewMemMember(size int64) *MemMember {
	return &MemMember{data: make([]byte, size&^(BlockSize-1))}
}

func (m *MemMember) rng(off, n int64) error {
	if off < 0 || off+n > int64(len(m.data)) {
		return invalidf("memory member access [%d,+%d) beyond %d", off, n, len(m.data))
	}
	return nil
}

// ReadAt implements Member.
func (m *MemMember) ReadAt(p []byte, off int64) (int, error) {
	if err := m.rng(off, int64(len(p))); err != nil {
		return 0, err
	}
	copy(p, m.data[off:])
	return len(p), nil
}

// WriteAt implements Member.
func (m *MemMember) WriteAt(p []byte, off int64) (int, error) {
	if err := m.rng(off, int64(len(p))); err != nil {
		return 0, err
	}
	copy(m.data[off:], p)
	return len(p), nil
}

// Flush implements Member.
func (m *MemMember) Flush() error { return nil }

// Discard implements Member (zeroes, like a punched hole).
func (m *MemMember) Discard(off, length int64) error { return m.WriteZeroes(off, length) }

// WriteZeroes implements Member.
func (m *MemMember) WriteZeroes(off, length int64) error {
	if err := m.rng(off, length); err != nil {
		return err
	}
	clear(m.data[off : off+length])
	return nil
}

// Size implements Member.
func (m *MemMember) Size() int64 { return int64(len(m.data)) }

// Close implements Member.
func (m *MemMember) Close() error { return nil }
