package pool

import (
	"slices"

	"k8s.io/klog/v2"
)

// Tombstones: a delete removes the extents of the disks present at that moment only. A
// disk that was away, or failed and not written, keeps its extents of the deleted object,
// and an assembly that meets them without a present disk that forgot the object (the
// deletedAway rule) would bring the object back. So every delete first records the
// object's UUID in the pool's tombstone list, which every label write carries (p.tombs);
// Open takes the union of the lists of all the disks it reads, whatever their state, and
// every path that brings a disk back (Open, AddDisk, ReaddDisk) releases the extents of
// tombstoned objects instead of assembling them. A UUID is never reused, so a tombstone
// is true on whichever disk it is found.
//
// Bound: a tombstone is dropped once every disk of the disk table that may still be used
// (not Removed) is present and holds no extent of the object; and the list keeps at most
// MaxTombstones entries, the newest by Seq (past that, the deletedAway rule alone guards
// the oldest deletes).

// tombstoned reports whether u was deleted. Caller holds p.mu or is Open.
func (p *Pool) tombstoned(u UUID) bool {
	return slices.ContainsFunc(p.tombs, func(t Tombstone) bool { return t.Volume == u })
}

// mergeTombstones returns a new list with the tombstones of both lists (one entry per
// object), in Seq order, the newest MaxTombstones of them.
func mergeTombstones(a, b []Tombstone) []Tombstone {
	out := slices.Clone(a)
	for _, t := range b {
		if !slices.ContainsFunc(out, func(o Tombstone) bool { return o.Volume == t.Volume }) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(x, y Tombstone) int {
		if x.Seq != y.Seq {
			if x.Seq < y.Seq {
				return -1
			}
			return 1
		}
		return compareUUID(x.Volume, y.Volume)
	})
	if len(out) > MaxTombstones {
		out = out[len(out)-MaxTombstones:]
	}
	return out
}

func compareUUID(a, b UUID) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// addTombstone records in memory that u is deleted (the next label writes carry it), with
// a Seq above every one the pool knows; tombstones no longer needed are dropped first.
// Caller holds p.mu or is Open.
func (p *Pool) addTombstone(u UUID) {
	if p.tombstoned(u) {
		return
	}
	p.pruneTombstones()
	var seq uint64
	for _, t := range p.tombs {
		seq = max(seq, t.Seq)
	}
	p.tombs = mergeTombstones(p.tombs, []Tombstone{{Volume: u, Seq: seq + 1, Deleted: p.now().UnixNano()}})
}

// pruneTombstones drops the tombstones that no disk can need any more: every disk of the
// table that is not Removed is present and its label holds no extent of the object. It
// reports whether any was dropped. Caller holds p.mu or is Open.
func (p *Pool) pruneTombstones() bool {
	kept := p.tombs[:0:0]
	for _, t := range p.tombs {
		if !p.releasedEverywhere(t.Volume) {
			kept = append(kept, t)
		}
	}
	dropped := len(kept) != len(p.tombs)
	p.tombs = kept
	return dropped
}

// releasedEverywhere reports whether every disk of the table that may be used again is
// present and holds no extent of u.
func (p *Pool) releasedEverywhere(u UUID) bool {
	for _, d := range p.disks {
		if d.uuid.IsZero() || d.state == 0 || d.state == DiskRemoved {
			continue
		}
		if !d.present || d.label == nil {
			return false
		}
		if slices.ContainsFunc(d.label.Extents, func(x ExtentEntry) bool { return x.Volume == u }) {
			return false
		}
	}
	return true
}

// gatherTombstones takes the union of the tombstone lists of every disk of this pool that
// Open adopted, whatever its state in the table. Open calls it before any label is
// written.
func (p *Pool) gatherTombstones() {
	for _, d := range p.disks {
		if d.present && d.label != nil {
			p.tombs = mergeTombstones(p.tombs, d.label.Tombstones)
		}
	}
}

// releaseTombstoned finishes the delete of every tombstoned object that d (a disk coming
// back into service) still holds extents of, on every present disk. Caller holds p.mu.
func (p *Pool) releaseTombstoned(d *disk) {
	var gone []UUID
	for _, x := range d.label.Extents {
		if p.tombstoned(x.Volume) && !slices.Contains(gone, x.Volume) {
			gone = append(gone, x.Volume)
		}
	}
	for _, u := range gone {
		klog.InfoS("Releasing the extents of a deleted volume (tombstone)", "volumeUUID", u, "disk", d.path)
		if err := p.finishDelete(u); err != nil {
			klog.ErrorS(err, "Finishing delete", "volumeUUID", u)
		}
	}
}

// takeTombstones merges the tombstones of d, a disk that returned after Open, into the
// pool's, and deletes the objects the pool assembled that they name (the pool opened
// without any disk that knew of the delete). The source of an unfinished copy is kept
// (the copy would lose its uncopied regions); the next Open deletes it. It reports
// whether the pool learnt a tombstone, so that the caller spreads the list to every
// disk. Caller holds p.mu.
func (p *Pool) takeTombstones(d *disk) bool {
	learnt := slices.ContainsFunc(d.label.Tombstones, func(t Tombstone) bool { return !p.tombstoned(t.Volume) })
	p.tombs = mergeTombstones(p.tombs, d.label.Tombstones)
	for _, v := range p.volumes {
		if !p.tombstoned(v.uuid) {
			continue
		}
		if t := p.copyFromLocked(v); t != nil {
			klog.ErrorS(nil, "A deleted volume is the source of an unfinished copy; kept until the next Open", "volume", v.name, "target", t.name)
			continue
		}
		if err := p.deleteLocked(v); err != nil {
			klog.ErrorS(err, "Deleting a volume a returning disk knows as deleted", "volume", v.name)
			continue
		}
		if p.byName[v.name] == v {
			delete(p.byName, v.name)
		}
		if p.snaps[v.name] == v {
			delete(p.snaps, v.name)
		}
		klog.InfoS("Deleted a volume a returning disk knows as deleted", "volume", v.name, "volumeUUID", v.uuid, "disk", d.path)
	}
	return learnt
}
