package raid10

import (
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// The read path of one chunk piece: read balancing between the two copies,
// the member read, and the slow path that serves a read error or a bad block
// from the other copy and rewrites the bad one. ReadAt and large reads are in
// readlarge.go.

// readPiece reads within one chunk, from the copy want (0: the chunk's
// first, 1: its second) when both are in sync and no resync is pending
// there, else (and for copyAny) from the one the balancing picks. A raw
// read (the copy's own I/O) skips the hydrate hook.
func (a *Array) readPiece(p []byte, aoff int64, want int, raw bool) error {
	c := aoff >> a.geo.chunkShift
	bk, err := a.enter(c)
	if err != nil {
		return err
	}
	for !raw {
		// Checked inside the bucket: a copy installs its hook with every
		// bucket drained (freeze), so a piece admitted after that sees it.
		h, r := a.pendingHydrate(aoff, int64(len(p)))
		if h == nil {
			break
		}
		a.exit(bk)
		if err := h.ensure(r, (aoff+int64(len(p))-1)>>h.shift, true); err != nil {
			return err
		}
		if bk, err = a.enter(c); err != nil {
			return err
		}
	}
	bk.rOps.Add(1)
	bk.rBytes.Add(uint64(len(p)))
	s0, r0, o0 := a.readCopy(c, aoff, want)
	if r0 == nil {
		a.exit(bk)
		return fmt.Errorf("%w: no in-sync copy of chunk %d", ErrIO, c)
	}
	// A copy marked bad there goes straight to the slow path.
	if l := r0.bad.Load(); l == nil || !l.overlaps(o0/BlockSize, int64(len(p))/BlockSize) {
		ok := false
		if a.rescue(s0) {
			err, ok = a.handedOff(s0, r0, opRead, p, o0, int64(len(p)), false)
		}
		if !ok {
			err = a.memberRead(s0, r0, p, o0)
		}
		if err == nil {
			a.exit(bk)
			return nil
		}
		s0.readErrs.Add(1)
		klog.V(2).InfoS("raid10: read error", "member", s0.idx, "offset", o0, "err", err)
	}
	// The slow path raises this bucket's barrier, so leave the bucket
	// first; the slow-path counter keeps Close waiting for it.
	a.slowOps.Add(1)
	defer a.slowOps.Add(-1)
	a.exit(bk)
	return a.readSlow(p, aoff, c)
}

// readCopy picks the copy a read of the piece at aoff of chunk c is served
// from, and its member offset: the copy want when both are in sync and no
// resync is pending there, else the less loaded one, then the one whose head
// is nearer. A nil ref: no copy is in sync.
func (a *Array) readCopy(c, aoff int64, want int) (*slot, *memberRef, int64) {
	within := aoff & (a.geo.chunk - 1)
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	s0, s1 := a.slots[d0], a.slots[d1]
	o0 += within
	o1 += within
	r0, r1 := s0.inSync(), s1.inSync()
	if r0 != nil && r1 != nil {
		// Prefer the less loaded copy, then the one whose head is nearer.
		swap := false
		if a.resyncActive.Load() && a.regionNeedsResync(aoff/a.geo.region) {
			swap = false // copies may differ: always the first
		} else if want != copyAny {
			swap = want == 1
		} else if i0, i1 := s0.inflight.Load(), s1.inflight.Load(); i1 < i0 {
			swap = true
		} else if i1 == i0 && absDist(s1.headPos.Load(), o1) < absDist(s0.headPos.Load(), o0) {
			swap = true
		}
		if swap {
			s0, r0, o0 = s1, r1, o1
		}
	} else if r0 == nil {
		s0, r0, o0 = s1, r1, o1
	}
	return s0, r0, o0
}

// readSlow serves a read that met a read error or a bad block: with the
// chunk's barrier raised (no write races it), block by block from a good
// copy, rewriting the copy that failed (see syncRange). Blocks that have no
// good copy are recorded bad and fail the read with EIO; nothing else is
// returned for them.
func (a *Array) readSlow(p []byte, aoff, c int64) error {
	bk := a.raise(c)
	defer a.lower(bk)
	if lost, _ := a.syncRange(c, aoff&(a.geo.chunk-1), p, modeRead, nil); lost > 0 {
		return fmt.Errorf("%w: %d blocks of chunk %d have no good copy", ErrIO, lost, c)
	}
	return nil
}

func absDist(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

func (a *Array) memberRead(s *slot, r *memberRef, p []byte, off int64) error {
	if err := r.refused(); err != nil {
		return err
	}
	out := &r.out[a.epoch.Load()%epochRing]
	out.Add(1)
	s.inflight.Add(1)
	// Sample the latency of one read in 16 (see rescue).
	var t0 time.Time
	sample := s.readOps.Load()&15 == 0
	if sample {
		t0 = time.Now()
	}
	n, err := r.m.ReadAt(p, off)
	s.inflight.Add(-1)
	out.Add(-1)
	if sample {
		lat := int64(time.Since(t0))
		old := s.wlat.Load()
		s.wlat.Store(old + (lat-old)/8)
	}
	s.headPos.Store(off + int64(n))
	s.readOps.Add(1)
	s.readBytes.Add(uint64(n))
	if err == nil && n != len(p) {
		err = fmt.Errorf("short read %d of %d", n, len(p))
	}
	return err
}
