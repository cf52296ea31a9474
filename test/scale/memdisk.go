package scale

import (
	"fmt"
	"sync"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// pageSize is the unit in which a MemDisk keeps data: a page that holds only zeroes is not
// kept, so a disk costs memory only for its labels, superblocks and bitmaps.
const pageSize = 64 << 10

// MemDisk is a sparse disk in memory, a raid10.Member for pool.Config.OpenDisk: what was
// written is kept in 64 KiB pages, everything else reads as zeroes. It is safe for
// concurrent use (one lock; a hollow node does no data I/O beyond metadata).
type MemDisk struct {
	size int64

	mu    sync.Mutex
	pages map[int64][]byte // by page index; never an all-zero page
}

var _ raid10.Member = (*MemDisk)(nil)

// NewMemDisk returns an empty (all-zero) disk of size bytes, rounded down to the engine's
// block size.
func NewMemDisk(size int64) *MemDisk {
	return &MemDisk{size: size &^ (raid10.BlockSize - 1), pages: map[int64][]byte{}}
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
		idx, in := pos/pageSize, pos%pageSize
		n := min(len(p)-done, int(pageSize-in))
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
		idx, in := pos/pageSize, pos%pageSize
		n := min(len(p)-done, int(pageSize-in))
		pg, ok := m.pages[idx]
		if !ok {
			if allZero(p[done : done+n]) {
				done += n
				continue
			}
			pg = make([]byte, pageSize)
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
		idx, in := pos/pageSize, pos%pageSize
		n := min(off+length-pos, pageSize-in)
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
	return int64(len(m.pages)) * pageSize
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
