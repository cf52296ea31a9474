package raid10

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// FaultyMember wraps a member and injects faults, for tests: errors on read,
// write or flush after N operations or on a byte range, added latency, the
// member disappearing (every call fails with ErrMemberGone until Reappear),
// and a volatile write cache whose unsynced writes Crash drops, to simulate
// power loss. The zero configuration passes everything through.
type FaultyMember struct {
	base Member

	gone      atomic.Bool
	latencyNs atomic.Int64
	stall     atomic.Pointer[chan struct{}] // non-nil: calls block until Unstall

	// Countdowns: when one reaches zero that operation and all later ones of
	// its kind fail. Negative means never.
	readsLeft, writesLeft, flushesLeft atomic.Int64

	mu       sync.Mutex
	bad      []faultRange
	volatile bool
	cache    map[int64][]byte // BlockSize blocks written since the last Flush
}

type faultRange struct {
	off, length int64
	read, write bool
}

// NewFaultyMember wraps base with no faults armed.
func NewFaultyMember(base Member) *FaultyMember {
	f := &FaultyMember{base: base}
	f.readsLeft.Store(-1)
	f.writesLeft.Store(-1)
	f.flushesLeft.Store(-1)
	return f
}

// Base returns the wrapped member.
func (f *FaultyMember) Base() Member { return f.base }

// FailReadsAfter makes reads fail after n more successful ones (n < 0 disarms).
func (f *FaultyMember) FailReadsAfter(n int64) { f.readsLeft.Store(n) }

// FailWritesAfter makes writes (and discards, write-zeroes) fail after n
// more successful ones (n < 0 disarms).
func (f *FaultyMember) FailWritesAfter(n int64) { f.writesLeft.Store(n) }

// FailFlushesAfter makes flushes fail after n more successful ones.
func (f *FaultyMember) FailFlushesAfter(n int64) { f.flushesLeft.Store(n) }

// FailRange makes reads and/or writes that touch [off, off+length) fail.
func (f *FaultyMember) FailRange(off, length int64, read, write bool) {
	f.mu.Lock()
	f.bad = append(f.bad, faultRange{off: off, length: length, read: read, write: write})
	f.mu.Unlock()
}

// ClearFaults disarms every countdown and range.
func (f *FaultyMember) ClearFaults() {
	f.readsLeft.Store(-1)
	f.writesLeft.Store(-1)
	f.flushesLeft.Store(-1)
	f.mu.Lock()
	f.bad = nil
	f.mu.Unlock()
}

// SetLatency adds d to every operation.
func (f *FaultyMember) SetLatency(d time.Duration) { f.latencyNs.Store(int64(d)) }

// Stall makes every call block (a hung disk) until Unstall; the calls then
// go on as if nothing happened.
func (f *FaultyMember) Stall() {
	ch := make(chan struct{})
	f.stall.CompareAndSwap(nil, &ch)
}

// Unstall releases the calls blocked by Stall.
func (f *FaultyMember) Unstall() {
	if ch := f.stall.Swap(nil); ch != nil {
		close(*ch)
	}
}

// Disappear makes every call fail with ErrMemberGone, as an unplugged disk.
func (f *FaultyMember) Disappear() { f.gone.Store(true) }

// Reappear undoes Disappear. The data is what it was.
func (f *FaultyMember) Reappear() { f.gone.Store(false) }

// SetVolatile turns the volatile write cache on or off. While on, writes
// stay in memory until Flush and Crash drops them.
func (f *FaultyMember) SetVolatile(on bool) {
	f.mu.Lock()
	f.volatile = on
	if f.cache == nil {
		f.cache = make(map[int64][]byte)
	}
	f.mu.Unlock()
}

// Crash simulates power loss: every write not yet flushed is dropped, except
// that with r non-nil each unsynced block independently has a one-in-two
// chance of having reached the medium anyway (writeback in any order).
// The member stays usable afterwards (as after a reboot).
func (f *FaultyMember) Crash(r *rand.Rand) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for off, b := range f.cache {
		if r != nil && r.IntN(2) == 0 {
			_, _ = f.base.WriteAt(b, off)
		}
	}
	f.cache = make(map[int64][]byte)
}

func (f *FaultyMember) pre(countdown *atomic.Int64, op string, off, n int64, read bool) error {
	if d := f.latencyNs.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if ch := f.stall.Load(); ch != nil {
		<-*ch
	}
	if f.gone.Load() {
		return ErrMemberGone
	}
	if countdown != nil {
		for {
			v := countdown.Load()
			if v < 0 {
				break
			}
			if v == 0 {
				return fmt.Errorf("%w: injected %s fault", ErrIO, op)
			}
			if countdown.CompareAndSwap(v, v-1) {
				break
			}
		}
	}
	if n > 0 {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, b := range f.bad {
			if off < b.off+b.length && b.off < off+n && ((read && b.read) || (!read && b.write)) {
				return fmt.Errorf("%w: injected %s fault at %d", ErrIO, op, off)
			}
		}
	}
	return nil
}

// ReadAt implements Member.
func (f *FaultyMember) ReadAt(p []byte, off int64) (int, error) {
	if err := f.pre(&f.readsLeft, "read", off, int64(len(p)), true); err != nil {
		return 0, err
	}
	f.mu.Lock()
	vol := f.volatile
	f.mu.Unlock()
	if !vol {
		return f.base.ReadAt(p, off)
	}
	// Under the lock: Flush writes the cache back into the base.
	f.mu.Lock()
	if n, err := f.base.ReadAt(p, off); err != nil {
		f.mu.Unlock()
		return n, err
	}
	for o := int64(0); o < int64(len(p)); o += BlockSize {
		if b, ok := f.cache[off+o]; ok {
			copy(p[o:], b)
		}
	}
	f.mu.Unlock()
	return len(p), nil
}

// WriteAt implements Member.
func (f *FaultyMember) WriteAt(p []byte, off int64) (int, error) {
	if err := f.pre(&f.writesLeft, "write", off, int64(len(p)), false); err != nil {
		return 0, err
	}
	f.mu.Lock()
	if f.volatile {
		for o := int64(0); o < int64(len(p)); o += BlockSize {
			b := make([]byte, BlockSize)
			copy(b, p[o:])
			f.cache[off+o] = b
		}
		f.mu.Unlock()
		return len(p), nil
	}
	f.mu.Unlock()
	return f.base.WriteAt(p, off)
}

// Flush implements Member; it writes the volatile cache back first.
func (f *FaultyMember) Flush() error {
	if err := f.pre(&f.flushesLeft, "flush", 0, 0, false); err != nil {
		return err
	}
	f.mu.Lock()
	offs := make([]int64, 0, len(f.cache))
	for off := range f.cache {
		offs = append(offs, off)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	for _, off := range offs {
		if _, err := f.base.WriteAt(f.cache[off], off); err != nil {
			f.mu.Unlock()
			return err
		}
		delete(f.cache, off)
	}
	f.mu.Unlock()
	return f.base.Flush()
}

func (f *FaultyMember) zeroCached(off, length int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.volatile {
		return false
	}
	for o := int64(0); o < length; o += BlockSize {
		f.cache[off+o] = make([]byte, BlockSize)
	}
	return true
}

// Discard implements Member.
func (f *FaultyMember) Discard(off, length int64) error {
	if err := f.pre(&f.writesLeft, "discard", off, length, false); err != nil {
		return err
	}
	if f.zeroCached(off, length) {
		return nil
	}
	return f.base.Discard(off, length)
}

// WriteZeroes implements Member.
func (f *FaultyMember) WriteZeroes(off, length int64) error {
	if err := f.pre(&f.writesLeft, "write-zeroes", off, length, false); err != nil {
		return err
	}
	if f.zeroCached(off, length) {
		return nil
	}
	return f.base.WriteZeroes(off, length)
}

// Size implements Member.
func (f *FaultyMember) Size() int64 { return f.base.Size() }

// Close implements Member. It does not close the base, so a test can
// assemble the base again.
func (f *FaultyMember) Close() error { return nil }
