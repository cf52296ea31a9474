package raid10

import (
	"errors"
	"fmt"
	"time"
)

// The copy hooks: copy before write on a live source, hydrate on access on
// the target, and ensure, which copies a region a piece needs first.

// hookSet is what an array's copy hooks are: at most one copy into it,
// any number out of it. It is replaced whole (copy on write).
type hookSet struct {
	hydrate *Copy
	cow     []*Copy
}

func (a *Array) updateHooks(f func(h *hookSet)) {
	a.hookMu.Lock()
	defer a.hookMu.Unlock()
	var h hookSet
	if old := a.hooks.Load(); old != nil {
		h.hydrate = old.hydrate
		h.cow = append([]*Copy(nil), old.cow...)
	}
	f(&h)
	if h.hydrate == nil && len(h.cow) == 0 {
		a.hooks.Store(nil)
		return
	}
	a.hooks.Store(&h)
}

// pendingCopy returns a copy and a region of it that must be copied before
// a write piece of [aoff, aoff+n) proceeds, or nil. One atomic load without
// hooks; with hooks, one bit test per region the piece touches.
func (a *Array) pendingCopy(aoff, n int64) (c *Copy, r int64, target bool) {
	h := a.hooks.Load()
	if h == nil {
		return nil, 0, false
	}
	return h.pending(aoff, n)
}

func (h *hookSet) pending(aoff, n int64) (c *Copy, r int64, target bool) {
	if c := h.hydrate; c != nil {
		if r, ok := c.missing(aoff, n); ok {
			return c, r, true
		}
	}
	for _, c := range h.cow {
		if r, ok := c.missing(aoff, n); ok {
			return c, r, false
		}
	}
	return nil, 0, false
}

// pendingHydrate is pendingCopy for a read piece: only the copy into the
// array counts.
func (a *Array) pendingHydrate(aoff, n int64) (*Copy, int64) {
	h := a.hooks.Load()
	if h == nil || h.hydrate == nil {
		return nil, 0
	}
	if r, ok := h.hydrate.missing(aoff, n); ok {
		return h.hydrate, r
	}
	return nil, 0
}

// hydrateRange copies every uncopied region of [off, off+n) of a copy
// target before a read of it.
func (a *Array) hydrateRange(off, n int64) error {
	for {
		c, r := a.pendingHydrate(off, n)
		if c == nil {
			return nil
		}
		if err := c.ensure(r, (off+n-1)>>c.shift, true); err != nil {
			return err
		}
	}
}

// install puts the hooks in: on a live source with every bucket drained,
// so every write piece admitted afterwards sees the hook and none
// admitted before is still running (the cut).
func (c *Copy) install() {
	c.tgt.updateHooks(func(h *hookSet) { h.hydrate = c })
	if !c.rec.Live {
		return
	}
	t0 := time.Now()
	c.src.freeze()
	c.src.updateHooks(func(h *hookSet) { h.cow = append(h.cow, c) })
	c.src.thaw()
	c.Pause = time.Since(t0)
}

// uninstall removes the hooks; pieces that loaded them before find the
// copy no longer running, or every bit set.
func (c *Copy) uninstall(target bool) {
	if c.rec.Live {
		c.src.updateHooks(func(h *hookSet) {
			out := h.cow[:0]
			for _, x := range h.cow {
				if x != c {
					out = append(out, x)
				}
			}
			h.cow = out
		})
	}
	if target {
		c.tgt.updateHooks(func(h *hookSet) {
			if h.hydrate == c {
				h.hydrate = nil
			}
		})
	}
}

// has reports whether region r needs no copy: its bit is set, or it lies
// beyond the copy.
func (c *Copy) has(r int64) bool {
	return r >= c.rec.Regions || c.bits[r>>6].Load()&(1<<(r&63)) != 0
}

// missing returns the first region of [aoff, aoff+n) that still needs a copy.
func (c *Copy) missing(aoff, n int64) (int64, bool) {
	for r := aoff >> c.shift; r <= (aoff+n-1)>>c.shift; r++ {
		if !c.has(r) {
			return r, true
		}
	}
	return 0, false
}

// ensure copies the region of aoff unless it is copied already; concurrent
// callers for one region wait for the one copy. A copy that failed (or was
// stopped) lets source writes go on once the failure is recorded
// (OnFail), and fails target I/O with ErrCopyFailed.
func (c *Copy) ensure(r, last int64, target bool) error {
	for {
		c.mu.Lock()
		if c.has(r) {
			c.mu.Unlock()
			return nil
		}
		if CopyState(c.state.Load()) != CopyRunning || c.stopped() {
			c.mu.Unlock()
			return c.hookErr(target)
		}
		if ch, ok := c.busy[r]; ok {
			c.mu.Unlock()
			<-ch
			continue
		}
		c.mu.Unlock()
		// This region and the uncopied ones after it up to the piece's last,
		// in one copy.
		k, ch := c.claim(r, last-r+1)
		if k == 0 {
			continue
		}
		bp := getBounce(int(k << c.shift))
		err := c.copyRegions(r, k, *bp)
		putBounce(bp)
		c.release(r, k, ch)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				// An array closed under the copy (Close without Stop): not a
				// failure of the copy; the record resumes it.
				return ErrClosed
			}
			c.fail(err)
			return c.hookErr(target)
		}
		return nil
	}
}

// hookErr is what I/O that met a copy no longer running gets: a source
// write goes on once the failure is recorded; target I/O fails.
func (c *Copy) hookErr(target bool) error {
	if CopyState(c.state.Load()) == CopyFailed {
		select {
		case <-c.failDone:
		case <-c.stop:
		}
	}
	if !target {
		return nil
	}
	if c.stopped() && CopyState(c.state.Load()) == CopyRunning {
		return ErrClosed
	}
	return fmt.Errorf("%w: the region was not copied from the source", ErrCopyFailed)
}
