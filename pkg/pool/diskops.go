package pool

import (
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// FailDisk marks a disk failed, as an operator does before pulling it (mdadm --fail): every
// volume with a member on it continues Degraded, and a hot spare, if any, takes its place.
// Failing a failed disk succeeds.
func (p *Pool) FailDisk(ref string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.openDiskLocked(ref)
	if err != nil {
		return err
	}
	switch d.state {
	case DiskFailed, DiskRemoved:
		return nil
	}
	p.failDiskLocked(d, "operator request")
	return nil
}

// failDiskLocked marks d failed in every volume and in the table, then tries a spare.
func (p *Pool) failDiskLocked(d *disk, reason string) {
	wasSpare := d.state == DiskSpare
	for _, a := range p.affected(d) {
		if a.v.arr != nil && a.v.roles[a.slot] != nil {
			if err := a.v.arr.FailMember(a.slot); err != nil {
				klog.ErrorS(err, "Failing member", "volume", a.v.name, "member", a.slot)
			}
		}
	}
	d.state = DiskFailed
	if err := p.writeTable(true); err != nil {
		klog.ErrorS(err, "Recording the failed disk")
	}
	klog.InfoS("Disk marked failed", "disk", d.path, "diskUUID", d.uuid, "reason", reason)
	p.emit(Event{Kind: EventDiskFailed, Disk: d.uuid.String(), DiskPath: d.path, Message: reason})
	if !wasSpare {
		p.useSpare(d)
	}
}

// affected lists the (volume, slot) pairs whose role is on d.
func (p *Pool) affected(d *disk) []struct {
	v    *volume
	slot int
} {
	var out []struct {
		v    *volume
		slot int
	}
	for _, v := range p.volumes {
		for i, u := range v.disks {
			if u == d.uuid {
				out = append(out, struct {
					v    *volume
					slot int
				}{v, i})
			}
		}
	}
	return out
}

// useSpare replaces the failed disk d with the first spare that has room.
func (p *Pool) useSpare(d *disk) {
	if len(p.affected(d)) == 0 {
		return
	}
	for _, s := range p.disks {
		if !s.present || s.state != DiskSpare {
			continue
		}
		if err := p.replaceOnto(d, s); err != nil {
			klog.ErrorS(err, "Spare not usable", "spare", s.path, "failed", d.path)
			continue
		}
		klog.InfoS("Hot spare took over a failed disk", "spare", s.path, "spareUUID", s.uuid, "failed", d.path)
		return
	}
}

// ReplaceDisk replaces a failed or missing disk with another: a new disk (blank, or with
// wipe set) is claimed; a pool disk may serve too (a spare, or an active disk with room
// that holds no member of the affected volumes); every volume that had a member
// on the old disk gets an extent on it and rebuilds onto it in the background (see
// VolumeInfo.Sync for progress). An Active disk must be failed first.
func (p *Pool) ReplaceDisk(ref string, with DiskConfig) (DiskInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old, err := p.openDiskLocked(ref)
	if err != nil {
		return DiskInfo{}, err
	}
	if old.usable() {
		return DiskInfo{}, fmt.Errorf("%w: disk %s is active; fail it first", ErrFailedPrecondition, ref)
	}
	if old.state == DiskRemoved {
		return DiskInfo{}, fmt.Errorf("%w: disk %s was already replaced", ErrFailedPrecondition, ref)
	}
	if old.uuid.IsZero() {
		// A listed disk the pool refused (unreadable, foreign, ...): it holds no role, so
		// "replacing" it would rebuild nothing. A member the pool cannot read is Missing
		// under its own UUID.
		return DiskInfo{}, fmt.Errorf("%w: disk %s is not a member of this pool (refused: %s); replace a Missing member by its UUID (the pool's disk list shows it)",
			ErrFailedPrecondition, ref, fmt.Sprint(old.refused)) // the refusal is text here: the error is FailedPrecondition, not EIO
	}
	// A volume that could not start because old's copy of it is the current one (its other
	// members missed writes while they were away): the replace would take its data away.
	for _, a := range p.affected(old) {
		if v := a.v; v.arr == nil && errors.Is(v.err, raid10.ErrWitnessNeeded) {
			return DiskInfo{}, fmt.Errorf("%w: disk %s holds the only current copy of %s (its other members missed writes while they were away): re-add the disk (ReaddDisk) so that it rebuilds from there, then replace it; or delete the %s first",
				ErrFailedPrecondition, ref, v.kindName(), v.kind())
		}
	}
	target, err := p.findDisk(with.Path)
	switch {
	case err == nil && target.present && (target.state == DiskSpare || target.state == DiskActive):
		// A spare, or an active disk with room (e.g. a blank disk a glob picked up at start).
		for _, a := range p.affected(old) {
			for _, u := range a.v.disks {
				if u == target.uuid {
					return DiskInfo{}, fmt.Errorf("%w: disk %s already holds a member of volume %q; both copies would share it",
						ErrFailedPrecondition, with.Path, a.v.name)
				}
			}
		}
	case err == nil && target.present:
		return DiskInfo{}, fmt.Errorf("%w: disk %s is already in the pool as %s", ErrFailedPrecondition, with.Path, target.state)
	default:
		if target, err = p.addNewDisk(with); err != nil {
			return DiskInfo{}, err
		}
	}
	if err := p.replaceOnto(old, target); err != nil {
		return DiskInfo{}, err
	}
	return p.diskInfo(target), nil
}

// addNewDisk opens and claims a disk not yet known to the pool. Caller holds p.mu.
func (p *Pool) addNewDisk(dc DiskConfig) (*disk, error) {
	f, err := p.openDisk(dc.Path)
	if err != nil {
		return nil, err
	}
	d := &disk{path: dc.Path, cfg: dc, file: f, size: uint64(f.size), ident: f.ident.String()}
	ls := readLabel(f.f)
	switch lerr := ls.err(); {
	case lerr == nil && !dc.Wipe:
		_ = f.close()
		if ls.label.Pool == p.uuid {
			return nil, fmt.Errorf("%w: disk %s already carries this pool's label (disk %s)", ErrFailedPrecondition, dc.Path, ls.label.Disk)
		}
		return nil, fmt.Errorf("%w: disk %s carries the label of pool %s (%q)", ErrOtherPool, dc.Path, ls.label.Pool, ls.label.PoolName)
	case lerr != nil && !errors.Is(lerr, errNoLabel) && !dc.Wipe:
		_ = f.close()
		return nil, fmt.Errorf("pool: refusing disk %s: %w (set wipe for this disk to erase it)", dc.Path, lerr)
	}
	// Recorded before the label is written, so that a claimed disk is always found again.
	d.uuid = NewUUID()
	if err := p.record(dc.Path, d.uuid); err != nil {
		_ = f.close()
		return nil, err
	}
	d.listed = p.listed(dc.Path)
	if err := p.claim(d); err != nil {
		if d.base != nil {
			_ = d.base.Close()
		}
		_ = f.close()
		p.unrecord(d.uuid)
		return nil, err
	}
	// A disk refused earlier under this path (since wiped by hand, say) is this one now.
	kept := p.disks[:0]
	for _, o := range p.disks {
		if o.refused == nil || o.path != d.path {
			kept = append(kept, o)
		}
	}
	kept = append(kept, d)
	p.disks = kept
	return d, nil
}

// replaceOnto moves every role of old onto target and starts the rebuilds.
//
// Order: (1) the new extents' metadata heads are zeroed and handed to the engine
// (ReplaceMember writes its superblock there and starts recovery; a crash here leaves free
// space with garbage); (2) target's label gets the extents, with the volume's member map
// naming target and its epoch raised (from now on that map is the newest: a restart
// assembles the role from target and resumes recovery); (3) the other members' labels get
// the new map; (4) the table records target Active and old Removed on every disk.
func (p *Pool) replaceOnto(old, target *disk) error {
	type plan struct {
		v    *volume
		slot int
		ext  ExtentEntry
		m    raid10.Member
	}
	var plans []plan
	scratch := *target.label
	scratch.Extents = append([]ExtentEntry(nil), target.label.Extents...)
	for _, a := range p.affected(old) {
		v := a.v
		if v.arr == nil {
			// Not assembled (refused, e.g. a member that did not answer in time): there is
			// no array to rebuild the new extent from, and a role moved onto an extent
			// without a superblock would make every later assembly refuse the volume. The
			// role stays on old, Missing once old is Removed: the next start assembles the
			// volume degraded from the others, and its Missing member is replaced then.
			klog.InfoS("Volume not assembled: its member stays on the replaced disk", "volume", v.name, "member", a.slot, "disk", old.path)
			continue
		}
		length := p.extentLen(v.size, v.members, p.volumeChunk(v))
		for _, r := range v.roles {
			if r != nil {
				length = r.ext.Length // the live extents' length (an interrupted expand may have grown them)
				break
			}
		}
		off, ok := allocate(&scratch, length, p.cfg.Allocation)
		if !ok {
			return fmt.Errorf("%w: disk %s has no free range of %d bytes for volume %q", ErrNoSpace, target.path, length, v.name)
		}
		disks := append([]UUID(nil), v.disks...)
		disks[a.slot] = target.uuid
		x := ExtentEntry{Volume: v.uuid, Offset: off, Length: length, VolumeSize: v.size, Epoch: v.epoch + 1,
			Role: uint16(a.slot), Members: uint16(v.members), Name: v.name, MemberDisks: disks,
			Flags: v.flags &^ (ExtentFlagCreating | ExtentFlagDeleting), CopySource: v.copySource}
		scratch.Extents = append(scratch.Extents, x)
		m, err := raid10.NewExtentMember(target.base, int64(off), int64(length))
		if err != nil {
			return fmt.Errorf("pool: extent on %s: %w", target.path, err)
		}
		plans = append(plans, plan{v, a.slot, x, m})
	}
	// Nothing changes unless every assembled volume can take its new member: a slot the
	// engine still serves (it refused to fail the member on old, the last in-sync copy of
	// some data) refuses ReplaceMember, and failing on it after the engine had already
	// switched another volume's slot to the new extent left that volume's labels naming
	// old: the next start trusted old's stale extent as in sync (pool matrix seed
	// 1796538883828929786, wrong data).
	for _, pl := range plans { // only assembled volumes have a plan (see above)
		for _, m := range pl.v.arr.Status().Members {
			if m.Slot == pl.slot && (m.State == raid10.MemberInSync || m.State == raid10.MemberRecovering) {
				return fmt.Errorf("%w: %s's member on disk %s is still in service (the last in-sync copy of some of its data): disk %s cannot be replaced until that volume has another copy",
					ErrFailedPrecondition, pl.v.kindName(), old.path, old.path)
			}
		}
	}
	for _, pl := range plans {
		// Zero the metadata head: a superblock left by an earlier volume must not pass
		// for a re-add. Recovery writes the rest.
		if err := pl.m.WriteZeroes(0, extentMetaSize); err != nil {
			return fmt.Errorf("pool: zero extent on %s: %w", target.path, err)
		}
		if pl.v.arr == nil {
			continue
		}
		if err := pl.v.arr.ReplaceMember(pl.slot, pl.m); err != nil {
			return fmt.Errorf("pool: volume %q: replace member %d: %w", pl.v.name, pl.slot, err)
		}
	}
	if err := p.fail("replace.engine"); err != nil {
		return err
	}
	if err := p.writeLabel(target, func(l *Label) {
		for _, pl := range plans {
			l.Extents = append(l.Extents, pl.ext)
		}
	}); err != nil {
		return err
	}
	if err := p.fail("replace.target-label"); err != nil {
		return err
	}
	for _, pl := range plans {
		v := pl.v
		v.disks, v.epoch = pl.ext.MemberDisks, pl.ext.Epoch
		v.roles[pl.slot] = &role{disk: target, ext: pl.ext, member: pl.m}
		if err := p.rewriteMap(v); err != nil {
			klog.ErrorS(err, "Recording the new member map", "volume", v.name)
		}
		klog.InfoS("Rebuild started", "volume", v.name, "member", pl.slot, "disk", target.path, "replaces", old.path)
	}
	if err := p.fail("replace.member-maps"); err != nil {
		return err
	}
	target.state = DiskActive
	old.state = DiskRemoved
	p.emit(Event{Kind: EventDiskReplaced, Disk: old.uuid.String(), DiskPath: old.path,
		Message: "volumes rebuild onto disk " + target.uuid.String() + " (" + target.path + ")"})
	if err := p.writeTable(true); err != nil {
		return err
	}
	p.unrecord(old.uuid) // the pool no longer needs it at a restart
	return nil
}

// rewriteMap writes v's member map and epoch into the entries of its present members.
func (p *Pool) rewriteMap(v *volume) error {
	var first error
	for _, r := range v.roles {
		if r == nil || !r.disk.present || r.disk.state == DiskFailed {
			continue
		}
		r.ext.MemberDisks, r.ext.Epoch = v.disks, v.epoch
		err := p.writeLabel(r.disk, func(l *Label) {
			for i := range l.Extents {
				if l.Extents[i].Volume == v.uuid && l.Extents[i].Offset == r.ext.Offset {
					l.Extents[i].MemberDisks, l.Extents[i].Epoch = v.disks, v.epoch
				}
			}
		})
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// AddDisk offers a disk to the running pool. A blank disk (or one whose configuration opts
// in to wiping, including a replaced disk of this pool) is claimed, as a hot spare when
// dc.Spare; if volumes are degraded by a
// failed disk, a new spare takes over at once. A disk of this pool that was missing comes
// back: its volumes re-add it and resync only what changed while it was away (the
// engine's write-intent bitmap).
func (p *Pool) AddDisk(dc DiskConfig) (DiskInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return DiskInfo{}, ErrClosed
	}
	if d, err := p.findDisk(dc.Path); err == nil && d.present {
		if d.state != DiskRemoved || !dc.Wipe {
			return p.diskInfo(d), nil
		}
		// A replaced disk offered again with wipe: forget it and claim it as a new disk.
		if d.base != nil {
			_ = d.base.Close()
		}
		_ = d.file.close()
		kept := p.disks[:0]
		for _, o := range p.disks {
			if o != d {
				kept = append(kept, o)
			}
		}
		p.disks = kept
	}
	f, err := p.openDisk(dc.Path)
	if err != nil {
		return DiskInfo{}, err
	}
	ls := readLabel(f.f)
	if l := ls.label; l != nil && l.Pool == p.uuid && !dc.Wipe {
		for _, d := range p.disks {
			if d.uuid == l.Disk && !d.present {
				return p.returnDisk(d, f, ls, dc)
			}
		}
	}
	_ = f.close()
	d, err := p.addNewDisk(dc)
	if err != nil {
		return DiskInfo{}, err
	}
	if err := p.writeTable(true); err != nil {
		return DiskInfo{}, err
	}
	if d.state == DiskSpare {
		for _, o := range p.disks {
			if (o.state == DiskFailed || (!o.present && o.state == DiskActive)) && len(p.affected(o)) > 0 {
				p.useSpare(o)
				break
			}
		}
	}
	return p.diskInfo(d), nil
}

// returnDisk brings back a missing disk of this pool.
func (p *Pool) returnDisk(d *disk, f *diskFile, ls labelSlots, dc DiskConfig) (DiskInfo, error) {
	if d.state != DiskRemoved {
		if err := p.record(dc.Path, d.uuid); err != nil {
			_ = f.close()
			return DiskInfo{}, err
		}
	}
	d.file, d.label, d.slot, d.path, d.cfg, d.listed = f, ls.label, ls.slot, dc.Path, dc, p.listed(dc.Path)
	d.refused = nil
	if err := d.openBase(); err != nil {
		_ = f.close()
		d.file = nil
		return DiskInfo{}, err
	}
	d.present = true
	// The entry of its refusal under this path (in use, unreadable, ...) is this disk now.
	for _, o := range append([]*disk(nil), p.disks...) {
		if o != d && o.refused != nil && !o.present && o.path == dc.Path {
			p.dropDisk(o)
		}
	}
	if d.state == DiskRemoved {
		return p.diskInfo(d), nil
	}
	// Its tombstones first: its label is rewritten with the pool's list.
	learnt := p.takeTombstones(d)
	if err := p.writeLabel(d, nil); err != nil {
		return DiskInfo{}, err
	}
	if d.state == DiskActive {
		p.releaseTombstoned(d)
		p.readdRoles(d)
		p.releaseDeletedAway(d)
		p.clearAway()
	}
	if learnt {
		if err := p.writeTable(false); err != nil {
			klog.ErrorS(err, "Spreading the tombstones of a returning disk")
		}
	}
	klog.InfoS("Disk returned", "disk", d.path, "diskUUID", d.uuid, "state", d.state)
	return p.diskInfo(d), nil
}

// ReaddDisk puts a failed disk that works again back into its volumes; each resyncs only
// the regions written while the disk was out (bitmap).
func (p *Pool) ReaddDisk(ref string) (DiskInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.openDiskLocked(ref)
	if err != nil {
		return DiskInfo{}, err
	}
	if !d.present || d.state != DiskFailed {
		return DiskInfo{}, fmt.Errorf("%w: disk %s is %s; only a present, failed disk can be re-added", ErrFailedPrecondition, ref, p.diskInfo(d).Status)
	}
	d.state = DiskActive
	if err := p.writeTable(true); err != nil {
		return DiskInfo{}, err
	}
	// Deleted while the disk was failed (its label not written then): release, as Open does.
	p.releaseTombstoned(d)
	p.readdRoles(d)
	p.releaseDeletedAway(d)
	return p.diskInfo(d), nil
}

// readdRoles hands d's extents back to the engine for every role the volume's member map
// still gives to d.
func (p *Pool) readdRoles(d *disk) {
	for _, x := range d.label.Extents {
		v := p.volumes[x.Volume]
		if v == nil || int(x.Role) >= len(v.roles) {
			continue
		}
		if v.disks[x.Role] != d.uuid {
			continue // the role moved on while the disk was away
		}
		x.MemberDisks, x.Epoch, x.VolumeSize = v.disks, v.epoch, v.size
		m, err := raid10.NewExtentMember(d.base, int64(x.Offset), int64(x.Length))
		if err != nil {
			klog.ErrorS(err, "Re-add", "volume", v.name, "disk", d.path)
			continue
		}
		v.roles[x.Role] = &role{disk: d, ext: x, member: m}
		if v.arr == nil {
			p.assembleLate(v)
			continue
		}
		if err := p.readdMember(v, int(x.Role), m); err != nil {
			klog.ErrorS(err, "Re-add", "volume", v.name, "disk", d.path, "member", x.Role)
			continue
		}
		klog.InfoS("Member re-added, resyncing changed regions", "volume", v.name, "member", x.Role, "disk", d.path)
	}
}
