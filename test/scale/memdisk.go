package scale

import (
	"fmt"
	"sync"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// DefaultPageSize is the unit in which a MemDisk keeps data unless told otherwise: a page
// that holds only zeroes is not kept, so a disk costs memory only for its labels,
// superblocks and bitmaps. It is the engine's block size, the unit of every metadata write:
// with 64 KiB pages (before) a volume's metadata held 256 KiB of pages, with 4 KiB pages
// 49 KiB (BenchmarkHollowVolumeMemory).
const DefaultPageSize = raid10.BlockSize

// MemDisk is a sparse disk in memory, a raid10.Member for pool.Config.OpenDisk: what was
// written is kept in pages (DefaultPageSize), everything else reads as zeroes. It is safe for
// concurrent use (one lock; a hollow node does no data I/O beyond metadata).
type MemDisk struct {
	size     int64
	pageSize int64

	mu    sync.Mutex
	pages map[int64][]byte // by page index; never an all-zero page
}

var _ raid10.Member = (*MemDisk)(nil)

// NewMemDisk returns an empty (all-zero) disk of size bytes, rounded down to the engine's
// block size, kept in pages of DefaultPageSize.
func NewMemDisk(size int64) *MemDisk { return NewMemDiskPages(size, DefaultPageSize) }

// NewMemDiskPages is NewMemDisk with pages of pageSize bytes (a power of two, at least
// raid10.BlockSize).
func NewMemDiskPages(size, pageSize int64) *MemDisk {
	if pageSize < raid10.BlockSize || pageSize&(pageSize-1) != 0 {
		panic(fmt.Sprintf("memory disk: page size %d: not a power of two of at least %d", pageSize, raid10.BlockSize))
	}
	return &MemDisk{size: size &^ (raid10.BlockSize - 1), pageSize: pageSize, pages: map[int64][]byte{}}
}

func (m *MemDisk) check(off, n int64) error {
	if off < 0 || n < 0 || off+n > m.size {
		return fmt.Errorf("memory disk: access [%d, +%d) beyond its %d bytes", off, n, m.size)
	}
	return nil
}

// ReadAt implements raid10.Member.
func (m *MemDisk) ReadAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for done := 0; done < len(p); {
		pos := off + int64(done)
		idx, in := pos/m.pageSize, pos%m.pageSize
		n := min(len(p)-done, int(m.pageSize-in))
		if pg, ok := m.pages[idx]; ok {
			copy(p[done:done+n], pg[in:])
		} else {
			clear(p[done : done+n])
		}
		done += n
	}
	return len(p), nil
}

// WriteAt implements raid10.Member.
func (m *MemDisk) WriteAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for done := 0; done < len(p); {
		pos := off + int64(done)
		idx, in := pos/m.pageSize, pos%m.pageSize
		n := min(len(p)-done, int(m.pageSize-in))
		pg, ok := m.pages[idx]
		if !ok {
			if allZero(p[done : done+n]) {
				done += n
				continue
			}
			pg = make([]byte, m.pageSize)
			m.pages[idx] = pg
		}
		copy(pg[in:], p[done:done+n])
		if allZero(pg) {
			delete(m.pages, idx)
		}
		done += n
	}
	return len(p), nil
}

// WriteZeroes implements raid10.Member: the pages of the range go (or are cleared in part).
func (m *MemDisk) WriteZeroes(off, length int64) error {
	if err := m.check(off, length); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for pos := off; pos < off+length; {
		idx, in := pos/m.pageSize, pos%m.pageSize
		n := min(off+length-pos, m.pageSize-in)
		if pg, ok := m.pages[idx]; ok {
			clear(pg[in : in+n])
			if allZero(pg) {
				delete(m.pages, idx)
			}
		}
		pos += n
	}
	return nil
}

// Discard implements raid10.Member (zeroes, like a punched hole in a file).
func (m *MemDisk) Discard(off, length int64) error { return m.WriteZeroes(off, length) }

// Flush implements raid10.Member: memory is as durable as it gets here.
func (m *MemDisk) Flush() error { return nil }

// Size implements raid10.Member.
func (m *MemDisk) Size() int64 { return m.size }

// Close implements raid10.Member; the contents stay, as on a disk.
func (m *MemDisk) Close() error { return nil }

// Resident is the memory the disk's pages take, in bytes.
func (m *MemDisk) Resident() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.pages)) * m.pageSize
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
