package pool

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// The pool fault matrix's transitions (see TestPoolMatrix).

// matrixSteps weighs each transition of the walk.
var matrixSteps = []struct {
	kind   string
	weight int
	do     func(w *walk) error
}{
	{"write", 16, (*walk).write},
	{"flush", 4, (*walk).flush},
	{"verify", 5, (*walk).verifyOne},
	{"create", 5, (*walk).create},
	{"snapshot", 5, (*walk).snapshot},
	{"clone", 3, (*walk).clone},
	{"restore", 3, (*walk).restore},
	{"delete", 4, (*walk).deleteOne},
	{"expand", 2, (*walk).expand},
	{"scrub", 2, (*walk).scrub},
	{"disk-fail", 2, (*walk).failDisk},
	{"disk-pull", 2, (*walk).pullDisk},
	{"disk-readd", 4, (*walk).readd},
	{"disk-return", 4, (*walk).returnDisk},
	{"disk-replace", 1, (*walk).replace},
	{"disk-spare", 1, (*walk).spare},
	{"restart", 2, (*walk).restart},
	{"crash", 2, (*walk).crash},
	{"late-source", 2, (*walk).lateSource},
	{"late-target", 2, (*walk).lateTarget},
}

// faultKinds are the transitions counted as faults, by the phase they met.
var faultKinds = map[string]bool{"disk-fail": true, "disk-pull": true, "crash": true, "restart": true}

func (w *walk) run(steps int) {
	total := 0
	for _, s := range matrixSteps {
		total += s.weight
	}
	for step := 0; step < steps && !w.t.Failed(); step++ {
		k := w.rng.IntN(total)
		i := 0
		for ; k >= matrixSteps[i].weight; i++ {
			k -= matrixSteps[i].weight
		}
		s := matrixSteps[i]
		ph := ""
		if faultKinds[s.kind] {
			ph = w.phase()
		}
		began := time.Now()
		err := s.do(w)
		if errors.Is(err, errSkip) {
			continue
		}
		w.tally.op(s.kind, err)
		if ph != "" && err == nil {
			w.tally.fault(s.kind, ph)
		}
		w.tally.mu.Lock()
		w.tally.steps++
		w.tally.mu.Unlock()
		if os.Getenv("POOL_MATRIX_TRACE") != "" {
			w.t.Logf("step %d: %s (%s, %v): %v", step, s.kind, ph, time.Since(began).Round(time.Millisecond), err)
		}
	}
	w.settle()
	w.tally.mu.Lock()
	w.tally.seeds++
	w.tally.mu.Unlock()
}

// errSkip: the transition had nothing to act on (not counted).
var errSkip = errors.New("nothing to do")

// pick returns a random element of xs, or "" for none.
func (w *walk) pick(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	return xs[w.rng.IntN(len(xs))]
}

// names lists the model's objects: volumes (snap false) or snapshots.
func (w *walk) names(snap bool) []string {
	var out []string
	for _, name := range sortedKeys(w.objs) {
		if o := w.objs[name]; o.snap == snap && !o.hidden {
			out = append(out, name)
		}
	}
	return out
}

func (w *walk) newName(prefix string) string {
	w.seq++
	return fmt.Sprintf("%s%d", prefix, w.seq)
}

// served picks a volume or snapshot of the model and asks the pool for its array.
func (w *walk) served() (*objModel, *raid10.Array, error) {
	o := w.objs[w.pick(w.names(false))]
	if o == nil {
		return nil, nil, errSkip
	}
	a, err := w.p.Array(o.name)
	return o, a, err
}

func (w *walk) write() error {
	o, a, err := w.served()
	if err != nil {
		return err
	}
	n := int64(len(o.blocks))
	first := w.rng.Int64N(n)
	return w.writeRange(o, a, first, min(n-first, 1+w.rng.Int64N(24)))
}

// writeRange writes k new blocks to o's array a at block first.
func (w *walk) writeRange(o *objModel, a *raid10.Array, first, k int64) error {
	tags := make([]uint64, k)
	buf := make([]byte, k*mBlock)
	for i := range tags {
		w.tag++
		tags[i] = w.tag
		fillTag(buf[int64(i)*mBlock:int64(i+1)*mBlock], w.tag)
	}
	_, err := a.WriteAt(buf, first*mBlock)
	o.wrote(first, tags, err)
	return err
}

func (w *walk) flush() error {
	o, a, err := w.served()
	if err != nil {
		return err
	}
	vi := volumeInfo(w.t, w.p, o.name)
	if err := a.Flush(); err != nil {
		return err
	}
	o.flushed(vi.Hydrated)
	return nil
}

func (w *walk) verifyOne() error {
	o := w.objs[w.pick(append(w.names(false), w.names(true)...))]
	if o == nil {
		return errSkip
	}
	w.verify(o)
	return nil
}

func (w *walk) create() error {
	name := w.newName("v")
	size := int64(1+w.rng.IntN(3)) * mib
	chunk := int64(4<<10) << w.rng.IntN(4)
	_, err := w.p.CreateVolume(name, uint64(size), CreateOptions{Members: 2 + w.rng.IntN(3), ChunkSize: chunk})
	if err == nil {
		w.objs[name] = newObj(name, false, size)
	}
	return err
}

func (w *walk) snapshot() error {
	src := w.objs[w.pick(w.names(false))]
	if src == nil {
		return errSkip
	}
	return w.snapshotOf(src)
}

// snapshotOf cuts a new snapshot of src.
func (w *walk) snapshotOf(src *objModel) error {
	name := w.newName("s")
	if _, err := w.p.CreateSnapshot(name, src.name); err != nil {
		return err
	}
	w.objs[name] = copyOf(name, true, src, int64(len(src.blocks))*mBlock)
	return nil
}

func (w *walk) clone() error {
	src := w.objs[w.pick(w.names(false))]
	if src == nil {
		return errSkip
	}
	return w.copyVolume(src, Source{Volume: src.name})
}

func (w *walk) restore() error {
	src := w.objs[w.pick(w.names(true))]
	if src == nil {
		return errSkip
	}
	return w.copyVolume(src, Source{Snapshot: src.name})
}

// copyVolume creates a volume from src (a clone or a restore), as large as src or 1 MiB
// larger.
func (w *walk) copyVolume(src *objModel, s Source) error {
	name := w.newName("c")
	size := int64(len(src.blocks))*mBlock + int64(w.rng.IntN(2))*mib
	if _, err := w.p.CreateVolume(name, uint64(size), CreateOptions{Members: 2 + w.rng.IntN(3), Source: &s}); err != nil {
		return err
	}
	w.objs[name] = copyOf(name, false, src, size)
	return nil
}

func (w *walk) deleteOne() error {
	o := w.objs[w.pick(append(w.names(false), w.names(true)...))]
	if o == nil {
		return errSkip
	}
	return w.delete(o)
}

func (w *walk) delete(o *objModel) error {
	var err error
	if o.snap {
		err = w.p.DeleteSnapshot(o.name)
	} else {
		err = w.p.DeleteVolume(o.name)
	}
	if err == nil {
		delete(w.objs, o.name)
	}
	return err
}

func (w *walk) expand() error {
	o := w.objs[w.pick(w.names(false))]
	if o == nil || int64(len(o.blocks))*mBlock >= 4*mib {
		return errSkip
	}
	vi, err := w.p.ExpandVolume(o.name, uint64(len(o.blocks))*mBlock+mib)
	if err == nil {
		o.grown(int64(vi.Size))
	}
	return err
}

func (w *walk) scrub() error {
	o := w.objs[w.pick(w.names(false))]
	if o == nil {
		return errSkip
	}
	kind := ScrubCheck
	if w.rng.IntN(2) == 0 {
		kind = ScrubRepair
	}
	_, err := w.p.StartScrub(o.name, kind)
	return err
}

// disksWith lists the paths of the pool's disks in one of the given statuses.
func (w *walk) disksWith(st ...DiskStatus) []string {
	var out []string
	for _, d := range w.p.Disks() {
		if d.Path != "" && slices.Contains(st, d.Status) && slices.Contains(w.paths, d.Path) {
			out = append(out, d.Path)
		}
	}
	return out
}

// out counts the disks not serving now: failed, missing, pulled or left out.
func (w *walk) out() int {
	n := len(w.absent) + len(w.pulled)
	for _, path := range w.disksWith(StatusFailed, StatusMissing) {
		if !w.absent[path] && !w.pulled[path] {
			n++
		}
	}
	return n
}

func (w *walk) failDisk() error {
	path := w.pick(w.disksWith(StatusActive))
	if path == "" || w.out() >= 2 || w.pulled[path] {
		return errSkip
	}
	return w.p.FailDisk(path)
}

// pullDisk makes a disk's data path fail, as a disk pulled from the slot does: the engine
// fails its members on their next I/O, and the pool's monitor the disk.
func (w *walk) pullDisk() error {
	path := w.pick(w.disksWith(StatusActive))
	if path == "" || w.out() >= 2 || w.pulled[path] {
		return errSkip
	}
	dataPath(path).Disappear()
	w.pulled[path] = true
	return nil
}

// readd puts a pulled disk back in its slot, or a failed one back into service.
func (w *walk) readd() error {
	path := w.pick(append(sortedKeys(w.pulled), w.disksWith(StatusFailed)...))
	if path == "" {
		return errSkip
	}
	if w.pulled[path] {
		dataPath(path).Reappear()
		delete(w.pulled, path)
	}
	_, err := w.p.ReaddDisk(path)
	return err
}

// returnDisk brings back a disk left out at the last Open.
func (w *walk) returnDisk() error {
	path := w.pick(sortedKeys(w.absent))
	if path == "" {
		return errSkip
	}
	return w.returnPath(path)
}

// returnPath brings back path, left out at the last Open, through AddDisk.
func (w *walk) returnPath(path string) error {
	_, err := w.p.AddDisk(DiskConfig{Path: path})
	if err == nil {
		delete(w.absent, path)
		// A volume whose disks were all away stays unknown until the next Open: AddDisk
		// brings back the roles of known volumes only. Those that are listed again are
		// back in the walk.
		for _, o := range w.objs {
			if o.hidden {
				_, errV := w.p.Volume(o.name)
				_, errS := w.p.Snapshot(o.name)
				o.hidden = errV != nil && errS != nil
			}
		}
	}
	return err
}

// replace puts a new disk in place of a failed or missing one; the old disk leaves the
// walk (as a replaced disk leaves the machine).
func (w *walk) replace() error {
	old := w.pick(w.disksWith(StatusFailed, StatusMissing))
	// Only while no other disk is out: a disk replaced while it holds the last copy of a
	// volume whose other disk is away takes that volume's data with it.
	if old == "" || w.pulled[old] || w.disks >= 10 || w.out() > 1 {
		return errSkip
	}
	path := w.newDiskFile()
	if _, err := w.p.ReplaceDisk(old, DiskConfig{Path: path}); err != nil {
		return err
	}
	w.added = true
	w.paths = append(slices.DeleteFunc(w.paths, func(p string) bool { return p == old }), path)
	delete(w.absent, old)
	return nil
}

func (w *walk) spare() error {
	if w.disks >= 10 {
		return errSkip
	}
	path := w.newDiskFile()
	if _, err := w.p.AddDisk(DiskConfig{Path: path, Spare: true}); err != nil {
		return err
	}
	w.added = true
	w.paths = append(w.paths, path)
	return nil
}

// leaveOut chooses the disks the next Open goes without: mostly none, else one or two.
func (w *walk) leaveOut() []string {
	var out []string
	for range w.rng.IntN(5) - 2 {
		path := w.pick(w.disksWith(StatusActive))
		if path != "" && !slices.Contains(out, path) && w.out()+len(out) < 2 {
			out = append(out, path)
		}
	}
	return out
}

// restart closes the pool cleanly and opens it again, perhaps without some disks.
func (w *walk) restart() error {
	w.restartWithout(w.leaveOut())
	return nil
}

// stopClean closes the pool cleanly: every acknowledged write is on its disks, but for
// the writes not flushed before a disk of the object was pulled: that disk's volatile
// cache went with it and Close cannot flush it (the flush fails there), so for such an
// object every block may hold what a crash would leave.
func (w *walk) stopClean() {
	w.beforeStop()
	if err := w.p.Close(); err != nil {
		w.t.Logf("close: %v", err)
	}
	for _, o := range w.objs {
		if slices.ContainsFunc(o.disks, func(p string) bool { return w.pulled[p] }) {
			o.crashed()
			continue
		}
		o.closedClean()
	}
	w.afterStop()
}

// restartWithout closes the pool cleanly and opens it again without the disks out.
func (w *walk) restartWithout(out []string) {
	w.stopClean()
	w.open(out)
}

// crash stops the pool as a killed process stops: under its lock (no label write runs),
// every disk's data path fails from now on and drops what it had not flushed (each block
// may have reached the disk), the label descriptors close; then Close ends the
// goroutines, whose I/O fails. The pool opens again, perhaps without some disks.
func (w *walk) crash() error {
	out := w.leaveOut()
	w.beforeStop()
	p := w.p
	p.mu.Lock()
	var ds []*matrixDisk
	for _, d := range p.disks {
		if m, ok := d.base.(*matrixDisk); ok {
			ds = append(ds, m)
			m.Disappear()
		}
	}
	for _, m := range ds {
		m.Crash(w.rng)
	}
	for _, d := range p.disks {
		if d.file != nil {
			_ = d.file.osFile().Close()
		}
	}
	p.mu.Unlock()
	_ = p.Close()
	for _, o := range w.objs {
		o.crashed()
	}
	w.afterStop()
	w.open(out)
	return nil
}

// beforeStop records each object's disks, so that the next Open knows which objects it
// cannot see.
func (w *walk) beforeStop() {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	for _, o := range w.objs {
		v := w.p.byName[o.name]
		if o.snap {
			v = w.p.snaps[o.name]
		}
		if v == nil {
			continue
		}
		o.disks = o.disks[:0]
		for _, u := range v.disks {
			for _, d := range w.p.disks {
				if d.uuid == u {
					o.disks = append(o.disks, d.path)
				}
			}
		}
	}
}

// afterStop: a pulled disk is back in its slot when the pool starts again.
func (w *walk) afterStop() {
	w.pulled = map[string]bool{}
	w.p = nil
}
