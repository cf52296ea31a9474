package raid10

import "sort"

// badRange is a run of BlockSize blocks of one member whose copy holds no
// valid data: blocks [start, start+count), in member blocks (member byte
// offset / BlockSize).
type badRange struct {
	start, count int64
}

// badList is one member's bad-block list (md's bad-block log): sorted,
// non-overlapping, adjacent runs merged. A list is immutable once
// published; changes build a new one under Array.metaMu and store it in
// memberRef.bad, so the fast path reads it with one atomic load (nil: no
// bad blocks, the common case).
type badList struct {
	r     []badRange
	total int64 // blocks
}

// maxBadRanges is how many runs a superblock holds (see the on-disk
// format). A member whose list would overflow is failed, as md fails a
// device whose bad-block log is full.
const maxBadRanges = (sbCRCOffset - sbBadEntries) / sbBadEntrySize

// overlaps reports whether any block of [start, start+count) is bad.
func (l *badList) overlaps(start, count int64) bool {
	if l == nil || len(l.r) == 0 {
		return false
	}
	// First run that ends after start.
	i := sort.Search(len(l.r), func(i int) bool { return l.r[i].start+l.r[i].count > start })
	return i < len(l.r) && l.r[i].start < start+count
}

// has reports whether block b is bad.
func (l *badList) has(b int64) bool { return l.overlaps(b, 1) }

// count is the number of bad blocks in [start, start+count).
func (l *badList) countIn(start, count int64) int64 {
	if l == nil {
		return 0
	}
	var n int64
	end := start + count
	for _, r := range l.r {
		lo, hi := max(r.start, start), min(r.start+r.count, end)
		if lo < hi {
			n += hi - lo
		}
	}
	return n
}

// blocks is the number of bad blocks; 0 for a nil list.
func (l *badList) blocks() int64 {
	if l == nil {
		return 0
	}
	return l.total
}

// add returns the list with [start, start+count) added, and false if the
// result would not fit in a superblock.
func (l *badList) add(start, count int64) (*badList, bool) {
	var rs []badRange
	if l != nil {
		rs = l.r
	}
	out := make([]badRange, 0, len(rs)+1)
	nr := badRange{start, count}
	placed := false
	for _, r := range rs {
		switch {
		case r.start+r.count < nr.start:
			out = append(out, r)
		case nr.start+nr.count < r.start:
			if !placed {
				out = append(out, nr)
				placed = true
			}
			out = append(out, r)
		default: // overlapping or adjacent: merge into nr
			lo := min(r.start, nr.start)
			hi := max(r.start+r.count, nr.start+nr.count)
			nr = badRange{lo, hi - lo}
		}
	}
	if !placed {
		out = append(out, nr)
	}
	if len(out) > maxBadRanges {
		return l, false
	}
	return newBadList(out), true
}

// remove returns the list without [start, start+count) (nil when empty).
func (l *badList) remove(start, count int64) *badList {
	if !l.overlaps(start, count) {
		return l
	}
	end := start + count
	out := make([]badRange, 0, len(l.r)+1)
	for _, r := range l.r {
		re := r.start + r.count
		if re <= start || r.start >= end {
			out = append(out, r)
			continue
		}
		if r.start < start {
			out = append(out, badRange{r.start, start - r.start})
		}
		if re > end {
			out = append(out, badRange{end, re - end})
		}
	}
	return newBadList(out)
}

func newBadList(rs []badRange) *badList {
	if len(rs) == 0 {
		return nil
	}
	l := &badList{r: rs}
	for _, r := range rs {
		l.total += r.count
	}
	return l
}

// ranges returns the runs (nil for an empty list).
func (l *badList) ranges() []badRange {
	if l == nil {
		return nil
	}
	return l.r
}

// recordBadLocked adds member byte range [off, off+length) to r's
// bad-block list and writes the superblocks, so the marks are durable
// before the caller relies on them. It reports false if r is no longer the
// slot's member or the list is full (the member is then failed, or, if it
// holds the last copy of some chunk, broken). Caller holds metaMu.
func (a *Array) recordBadLocked(s *slot, r *memberRef, off, length int64) bool {
	if s.ref.Load() != r {
		return false
	}
	if st := MemberState(s.state.Load()); st != MemberInSync && st != MemberRecovering {
		return false
	}
	if s.broken.Load() {
		// Its superblock cannot be written: no mark of it is durable, and
		// one kept in memory must not count as recorded either.
		return false
	}
	start, count := off/BlockSize, length/BlockSize
	if l := r.bad.Load(); l != nil && l.countIn(start, count) == count {
		return true
	}
	nl, ok := r.bad.Load().add(start, count)
	if !ok {
		a.memberFailedLocked(s, r, "record bad blocks", errBadListFull)
		return false
	}
	r.bad.Store(nl)
	a.writeSuperblocksLocked(true, false)
	// The marks count only if they reached this member's superblock.
	return s.ref.Load() == r && !s.failing.Load() && !s.broken.Load() &&
		MemberState(s.state.Load()) != MemberFaulty
}

// recordBad is recordBadLocked taking metaMu.
func (a *Array) recordBad(s *slot, r *memberRef, off, length int64) bool {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	return a.recordBadLocked(s, r, off, length)
}

// clearBad removes [off, off+length) from r's list after a write put valid
// data there, and persists the list. A crash before the superblocks are
// written only leaves blocks marked that hold good data (reads there avoid
// the copy or fail), never the reverse.
func (a *Array) clearBad(s *slot, r *memberRef, off, length int64) {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	if s.ref.Load() != r {
		return
	}
	l := r.bad.Load()
	nl := l.remove(off/BlockSize, length/BlockSize)
	if nl == l {
		return
	}
	r.bad.Store(nl)
	a.writeSuperblocksLocked(true, false)
}

// badBlockCounts returns the bad blocks summed over the members and the
// blocks that have no good copy: bad on one copy while the other copy is
// bad too or not in sync.
func (a *Array) badBlockCounts() (bad, lost int64) {
	g := &a.geo
	n := int64(g.n)
	perChunk := g.chunk / BlockSize
	dataStart := g.dataOffset / BlockSize
	for d, s := range a.slots {
		r := s.live()
		if r == nil {
			continue
		}
		l := r.bad.Load()
		bad += l.blocks()
		if l == nil || s.inSync() != r {
			continue // a recovering member's marks lose nothing yet
		}
		for _, br := range l.r {
			for b := br.start; b < br.start+br.count; b++ {
				rel := b - dataStart
				if rel < 0 {
					continue
				}
				row, within := rel/perChunk, rel%perChunk
				v := row*n + int64(d) // md's chunk slot
				c := v / 2
				if c >= g.chunks {
					continue
				}
				ov := v ^ 1
				od, orow := int(ov%n), ov/n
				ob := dataStart + orow*perChunk + within
				other := a.slots[od]
				or := other.inSync()
				if or == nil || or.bad.Load().has(ob) {
					// Count a block lost on both copies once: from the
					// first copy, or from this one if the other is not in
					// sync (then it has no entry to count from).
					if or == nil || v&1 == 0 {
						lost++
					}
				}
			}
		}
	}
	return bad, lost
}
