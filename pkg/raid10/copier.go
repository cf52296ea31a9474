package raid10

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// The background copier: it copies the uncopied regions at the rebuild rate
// and records the copy ready when every bit is set.

// stopped reports whether Stop was called.
func (c *Copy) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// copyRegions copies regions [r, r+k) (as the source reads now, which is
// the cut: their bits are clear, and the caller holds them busy) into the
// target, makes them durable and durably sets their bits. Blocks the source
// has recorded lost (bad on every in-sync copy) are recorded bad on every
// copy of the target (reads of them fail there as on the source), never
// zero; a block the source cannot read without having recorded it lost
// (its members are gone or hung) fails the copy. A source that is itself
// a copy target whose copy failed (a restore from a snapshot still being
// filled) does not hold the regions it never got: that fails this copy
// too, since they are not lost media but data this target can never have.
func (c *Copy) copyRegions(r, k int64, b []byte) error {
	off := r << c.shift
	n := min(k<<c.shift, c.rec.Size-off)
	buf := b[:n]
	var lost []badRange
	// read, not ReadAt: the copy's reads are not under the source's Limits.
	if _, err := c.src.read(buf, off, false); err != nil {
		if err := notLost(err, r); err != nil {
			return err
		}
		// Block by block: a block no copy of the source has is lost.
		for b := int64(0); b < n; b += BlockSize {
			p := buf[b : b+BlockSize]
			if _, err := c.src.read(p, off+b, false); err != nil {
				if err := notLost(err, r); err != nil {
					return err
				}
				if !c.src.recordedLost(off + b) {
					// Unreadable now, not lost: the source's members holding it are
					// gone or hung. Holes recorded here would read EIO for good
					// though the data comes back with the disks; the copy fails
					// instead (its target is refused service, never served wrong).
					return fmt.Errorf("copy: region %d: source block %d unreadable but not recorded lost (its members are unavailable): %w",
						r, (off+b)/BlockSize, err)
				}
				clear(p)
				lost = addRun(lost, (off+b)/BlockSize, 1)
			}
		}
		klog.ErrorS(nil, "raid10: copy: source blocks unreadable, recorded lost on the target", "region", r, "regions", k, "runs", len(lost))
	}
	if _, err := c.tgt.write(opWrite, buf, off, n, false, true); err != nil {
		if errors.Is(err, ErrClosed) {
			return err
		}
		return fmt.Errorf("copy: write region %d to the target: %w", r, err)
	}
	for _, l := range lost {
		if err := c.tgt.markLost(l.start*BlockSize, l.count*BlockSize); err != nil {
			return fmt.Errorf("copy: region %d: %w", r, err)
		}
	}
	return c.commit(r, k, n)
}

// notLost is the error copyRegions returns for a source read error of region r that is
// not lost media: the source closed (ErrClosed), or the source's own copy failed there
// (ErrCopyFailed, which fails this copy). nil for a read error of the media.
func notLost(err error, r int64) error {
	switch {
	case errors.Is(err, ErrClosed):
		return err
	case errors.Is(err, ErrCopyFailed):
		return fmt.Errorf("copy: region %d: the source does not hold it, its own copy failed: %w", r, err)
	}
	return nil
}

// claim marks up to most consecutive uncopied regions from r busy for the
// copier and returns how many; 0 if region r is copied or busy.
func (c *Copy) claim(r, most int64) (int64, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	k := int64(0)
	for ; k < most && r+k < c.rec.Regions && !c.has(r+k); k++ {
		if _, busy := c.busy[r+k]; busy {
			break
		}
		c.busy[r+k] = ch
	}
	return k, ch
}

func (c *Copy) release(r, k int64, ch chan struct{}) {
	c.mu.Lock()
	for x := r; x < r+k; x++ {
		delete(c.busy, x)
	}
	close(ch)
	c.mu.Unlock()
}

// Start runs the background copier (once).
func (c *Copy) Start() {
	if !c.started.CompareAndSwap(false, true) {
		return
	}
	if CopyState(c.state.Load()) != CopyRunning {
		return
	}
	go c.run()
}

func (c *Copy) run() {
	defer close(c.done)
	start, base := time.Now(), c.copied.Load()
	gen := c.tgt.rates.gen.Load()
	lastFg := c.src.fgWrites()
	most := int64(len(c.batch)) >> c.shift
	for r := int64(0); r < c.rec.Regions; {
		if c.stopped() || CopyState(c.state.Load()) != CopyRunning {
			return
		}
		if c.has(r) {
			r++
			continue
		}
		k, ch := c.claim(r, most)
		if k == 0 {
			// A foreground write copies it now: wait for that.
			if err := c.ensure(r, r, true); err != nil {
				return
			}
			r++
			continue
		}
		err := c.copyRegions(r, k, c.batch)
		c.release(r, k, ch)
		if err != nil {
			if !errors.Is(err, ErrClosed) {
				c.fail(err)
			}
			return
		}
		r += k
		// The target's rates (Rates, loaded per batch): at most SyncMax,
		// falling back towards SyncMin while the source takes writes (its
		// own reads of the source do not count). A change of rates starts
		// the rate's window again, so the copy follows the new rate.
		if g := c.tgt.rates.gen.Load(); g != gen {
			gen, start, base = g, time.Now(), c.copied.Load()
		}
		done := c.copied.Load() - base
		el := time.Since(start)
		rate := float64(done) / max(el.Seconds(), 1e-6)
		o := c.tgt.Rates()
		if o.SyncMax > 0 && rate > float64(o.SyncMax) {
			c.sleep(min(time.Duration(float64(done)/float64(o.SyncMax)*float64(time.Second))-el, 200*time.Millisecond))
		} else if fg := c.src.fgWrites(); fg != lastFg {
			lastFg = fg
			if o.SyncMin > 0 && rate > float64(o.SyncMin) {
				c.sleep(min(time.Duration(float64(done)/float64(o.SyncMin)*float64(time.Second))-el, 10*time.Millisecond))
			}
		}
	}
	if c.stopped() || CopyState(c.state.Load()) != CopyRunning {
		return
	}
	if err := c.writeState(CopyReady); err != nil {
		c.fail(fmt.Errorf("copy: record ready: %w", err))
		return
	}
	c.state.Store(uint32(CopyReady))
	c.uninstall(true)
	c.ended()
	close(c.ready)
	klog.InfoS("raid10: copy ready", "source", fmt.Sprintf("%x", c.rec.Source), "target", fmt.Sprintf("%x", c.rec.Target), "bytes", c.rec.Size)
	if c.cfg.OnReady != nil {
		c.cfg.OnReady()
	}
}

// fgWrites counts the array's write pieces: the copier's yield signal (its
// own reads of the source would make fgOps move every time).
func (a *Array) fgWrites() uint64 {
	var n uint64
	for i := range a.buckets {
		n += a.buckets[i].wOps.Load()
	}
	return n
}

func (c *Copy) sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.stop:
	}
}

// markLost records array bytes [off, off+length) bad on every live copy:
// reads there fail with EIO until a write puts data there. It fails if a
// live copy could not record them.
func (a *Array) markLost(off, length int64) error {
	for length > 0 {
		c := off >> a.geo.chunkShift
		within := off & (a.geo.chunk - 1)
		n := min(length, a.geo.chunk-within)
		d0, d1, o0, o1 := a.geo.mapChunk(c)
		for _, x := range [2]struct {
			s *slot
			o int64
		}{{a.slots[d0], o0 + within}, {a.slots[d1], o1 + within}} {
			if r := x.s.live(); r != nil && !a.recordBad(x.s, r, x.o, n) {
				return fmt.Errorf("%w: blocks at %d could not be recorded bad on member %d", ErrIO, off, x.s.idx)
			}
		}
		off += n
		length -= n
	}
	return nil
}
