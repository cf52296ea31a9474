package pool

import "slices"

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
	var pair []string
	for _, name := range names {
		if ds := w.memberPaths(name); len(ds) >= 3 && ds[0] != "" && ds[1] != "" {
			src, pair = w.objs[name], ds[:2]
			break
		}
	}
	if src == nil {
		return errSkip
	}
	if err := w.snapshotOf(src); err != nil {
		return err
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
