package pool

import (
	"fmt"
	"slices"
)

// lateSource is the pool fault matrix's walk through issue 23's item 1, which random steps
// rarely line up: a snapshot of a volume is cut, the pool restarts with two of the volume's
// disks that mirror each other left out (the volume is known but not assembled, and the
// snapshot's copy stops), both return through AddDisk (the volume is assembled late), the
// volume takes a write over its whole range, and the pool restarts with every disk. The
// snapshot must still read the cut, or be Failed (open verifies every object): a late
// assembly that hands the volume out without its copy hook, or without moving its copy
// generation on, lets the next Open fill the snapshot from the rewritten volume.
func (w *walk) lateSource() error {
	if w.out() > 0 {
		return errSkip
	}
	names := w.names(false)
	w.rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	var src *objModel
	var ds []string
	for _, name := range names {
		vi, err := w.p.Volume(name)
		if _, errA := w.p.Array(name); err != nil || errA != nil || !vi.Hydrated {
			continue // not served, or still a copy target: the restart would fail its copy
		}
		if ds = w.memberPaths(name); len(ds) >= 3 {
			src = w.objs[name]
			break
		}
	}
	if src == nil {
		return errSkip
	}
	if err := w.snapshotOf(src); err != nil {
		return err
	}
	pair := w.mirrorsAway(ds, w.memberPaths(fmt.Sprintf("s%d", w.seq)))
	if pair == nil {
		return nil
	}
	w.restartWithout(pair)
	for _, path := range pair {
		if err := w.returnPath(path); err != nil {
			return err
		}
	}
	a, err := w.p.Array(src.name)
	if err != nil {
		return err
	}
	werr := w.writeRange(src, a, 0, int64(len(src.blocks)))
	w.restartWithout(nil)
	return werr
}

// memberPaths lists the paths of the Active disks holding roles 0, 1, ... of volume name
// ("" for a role whose disk is not Active).
func (w *walk) memberPaths(name string) []string {
	active := w.disksWith(StatusActive)
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	v := w.p.byName[name]
	if v == nil {
		v = w.p.snaps[name]
	}
	if v == nil {
		return nil
	}
	out := make([]string, len(v.disks))
	for r, u := range v.disks {
		for _, d := range w.p.disks {
			if d.uuid == u && slices.Contains(active, d.path) {
				out[r] = d.path
			}
		}
	}
	return out
}

// lateTarget is the walk through issue 23's item 2: a volume is written end to end and a
// clone of it is created on three disks; the pool restarts while its copy runs with two of
// the clone's disks that mirror each other left out (it is not assembled, so its copy is marked failed), both return through
// AddDisk (it is assembled late), and it is verified: it must be refused and Failed, or
// read its source as of its creation; never be served with the blocks its copy missed.
func (w *walk) lateTarget() error {
	if w.out() > 0 {
		return errSkip
	}
	src := w.objs[w.pick(w.names(false))]
	if src == nil {
		return errSkip
	}
	// Written end to end first, so that what the copy misses cannot read as its source.
	a, err := w.p.Array(src.name)
	if err != nil {
		return err
	}
	if err := w.writeRange(src, a, 0, int64(len(src.blocks))); err != nil {
		return err
	}
	s := Source{Volume: src.name}
	name := w.newName("c")
	size := int64(len(src.blocks)) * mBlock
	if _, err := w.p.CreateVolume(name, uint64(size), CreateOptions{Members: 3, Source: &s}); err != nil {
		return err
	}
	w.objs[name] = copyOf(name, false, src, size)
	ds := w.memberPaths(name)
	if len(ds) < 3 || ds[0] == "" || ds[1] == "" {
		return nil
	}
	w.restartWithout(ds[:2])
	for _, path := range ds[:2] {
		if err := w.returnPath(path); err != nil {
			return err
		}
	}
	w.verify(w.objs[name])
	return nil
}

// mirrorsAway picks two disks of adjacent roles in ds (which share data), both Active,
// preferring a pair that holds none of the snapshot's disks (snap), so that the snapshot
// stays assembled and its copy stops rather than fails; nil if no adjacent pair is Active.
func (w *walk) mirrorsAway(ds, snap []string) []string {
	var found []string
	for r := range ds {
		a, b := ds[r], ds[(r+1)%len(ds)]
		if a == "" || b == "" || a == b {
			continue
		}
		if !slices.Contains(snap, a) && !slices.Contains(snap, b) {
			return []string{a, b}
		}
		if found == nil {
			found = []string{a, b}
		}
	}
	return found
}
