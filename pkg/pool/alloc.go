package pool

import "sort"

// span is a byte range [Off, Off+Len) of a disk.
type span struct {
	Off, Len uint64
}

func (s span) end() uint64 { return s.Off + s.Len }

// freeSpans returns the free ranges of a disk's data area, in disk order, each aligned to
// the label's alignment at both ends (unaligned slivers are not allocatable).
func freeSpans(l *Label) []span {
	used := make([]span, 0, len(l.Extents))
	for _, x := range l.Extents {
		used = append(used, span{x.Offset, x.Length})
	}
	sort.Slice(used, func(i, j int) bool { return used[i].Off < used[j].Off })
	a := uint64(l.Alignment)
	var free []span
	cur := alignUp(l.DataStart, a)
	end := alignDown(l.DataEnd, a)
	for _, u := range used {
		if s := alignDown(u.Off, a); s > cur {
			free = append(free, span{cur, s - cur})
		}
		cur = max(cur, alignUp(u.end(), a))
	}
	if end > cur {
		free = append(free, span{cur, end - cur})
	}
	return free
}

// allocate picks where an extent of length bytes goes on the disk, by policy. ok is false
// when no free range is large enough.
func allocate(l *Label, length uint64, policy AllocPolicy) (off uint64, ok bool) {
	length = alignUp(length, uint64(l.Alignment))
	best := span{}
	for _, f := range freeSpans(l) {
		if f.Len < length {
			continue
		}
		if policy != BestFit {
			return f.Off, true
		}
		if !ok || f.Len < best.Len {
			best, ok = f, true
		}
	}
	return best.Off, ok
}

// growable returns how many bytes directly after the extent at off are free, i.e. by how
// much the extent can grow in place.
func growable(l *Label, off uint64) uint64 {
	var ext *ExtentEntry
	for i := range l.Extents {
		if l.Extents[i].Offset == off {
			ext = &l.Extents[i]
		}
	}
	if ext == nil {
		return 0
	}
	for _, f := range freeSpans(l) {
		if f.Off == alignUp(ext.Offset+ext.Length, uint64(l.Alignment)) {
			return f.end() - (ext.Offset + ext.Length)
		}
	}
	return 0
}

// largestFree is the length of the largest free range of the disk.
func largestFree(l *Label) uint64 {
	var m uint64
	for _, f := range freeSpans(l) {
		m = max(m, f.Len)
	}
	return m
}

// totalFree is the sum of the disk's free ranges.
func totalFree(l *Label) uint64 {
	var t uint64
	for _, f := range freeSpans(l) {
		t += f.Len
	}
	return t
}

func alignUp(v, a uint64) uint64   { return (v + a - 1) / a * a }
func alignDown(v, a uint64) uint64 { return v / a * a }
