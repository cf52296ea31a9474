package pool

import (
	"fmt"
	"slices"
	"sort"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// assembleAll builds every volume from the extent tables of the present disks: the entry
// with the highest epoch carries the volume's member map, and only extents that map names
// are used (a replaced disk that comes back is not); roles on failed or missing disks are
// left out, so the array starts degraded.
// Volumes marked deleting or tombstoned are deleted; superseded extents on present disks
// are released.
func (p *Pool) assembleAll() {
	type cand struct {
		d *disk
		x ExtentEntry
	}
	byVol := map[UUID][]cand{}
	deleting := map[UUID]bool{}
	for _, d := range p.disks {
		if !d.present || d.label == nil || d.state == DiskRemoved {
			continue
		}
		for _, x := range d.label.Extents {
			byVol[x.Volume] = append(byVol[x.Volume], cand{d, x})
			if x.Flags&(ExtentFlagDeleting|ExtentFlagCreating) != 0 || p.tombstoned(x.Volume) {
				deleting[x.Volume] = true
			}
		}
	}
	uuids := make([]UUID, 0, len(byVol))
	for u := range byVol {
		uuids = append(uuids, u)
	}
	sort.Slice(uuids, func(i, j int) bool { return uuids[i].String() < uuids[j].String() })
	for _, u := range uuids {
		cs := byVol[u]
		if deleting[u] {
			klog.InfoS("Finishing an interrupted volume delete, rolling back an interrupted create, or releasing a deleted volume's extents (tombstone)",
				"volumeUUID", u, "volume", cs[0].x.Name, "tombstone", p.tombstoned(u))
			if err := p.finishDelete(u); err != nil {
				klog.ErrorS(err, "Finishing delete", "volumeUUID", u)
			}
			continue
		}
		// The entry with the highest epoch holds the current member map, size and name; an
		// entry is live only if that map gives its role to its disk.
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].x.Epoch > cs[j].x.Epoch })
		head := cs[0].x
		v := &volume{uuid: u, name: head.Name, size: head.VolumeSize, members: int(head.Members),
			roles: make([]*role, head.Members), epoch: head.Epoch, disks: append([]UUID(nil), head.MemberDisks...),
			flags: head.Flags, copySource: head.CopySource, snap: head.Flags&ExtentFlagSnapshot != 0}
		for _, c := range cs {
			// A copy failure recorded on any disk holds (it may not have reached them all).
			if c.x.Flags&ExtentFlagCopyFailed != 0 {
				v.flags = v.flags&^ExtentFlagCopying | ExtentFlagCopyFailed
			}
			// So does a finished copy: a copy target's extents are made copying and the
			// flag is only ever cleared, so an extent of it without the flag was written
			// after the copy ended. An extent that was away then keeps the flag, and a
			// member map change (a spare's takeover) carries its entry to the same epoch
			// as the fresh ones: the head is not the only judge. Without this a finished
			// snapshot resumed its copy from a source that took writes since (pool matrix
			// seed 1796199122708649481).
			if v.flags&ExtentFlagCopying != 0 && c.x.Flags&ExtentFlagCopy != 0 && c.x.Flags&(ExtentFlagCopying|ExtentFlagCreating) == 0 {
				v.flags &^= ExtentFlagCopying
			}
		}
		var stale []cand
		repair := false
		for _, c := range cs {
			r := int(c.x.Role)
			if r >= v.members || v.disks[r] != c.d.uuid || v.roles[r] != nil {
				stale = append(stale, c)
				continue
			}
			x := c.x
			if x.Epoch != v.epoch && c.d.usable() {
				repair = true // a replace stopped before every member got the new map
			}
			x.MemberDisks, x.VolumeSize, x.Epoch, x.Name = v.disks, v.size, v.epoch, v.name
			v.roles[r] = &role{disk: c.d, ext: x}
		}
		if d := p.deletedAway(v); d != nil {
			// Deleted while this disk was away: the disks that were present forgot it.
			klog.InfoS("Releasing the extents of a volume deleted while they were away", "volume", v.name, "volumeUUID", u, "memberDisk", d.path)
			if err := p.finishDelete(u); err != nil {
				klog.ErrorS(err, "Finishing delete", "volumeUUID", u)
			}
			continue
		}
		if repair {
			klog.InfoS("Bringing member maps up to date", "volume", v.name, "epoch", v.epoch)
			if err := p.rewriteMap(v); err != nil {
				klog.ErrorS(err, "Member map repair", "volume", v.name)
			}
		}
		if other := p.byName[v.name]; other != nil || p.snaps[v.name] != nil {
			klog.ErrorS(nil, "Two volumes or snapshots with one name; keeping the first", "name", v.name, "uuid", u)
			continue
		}
		p.volumes[u] = v
		if v.snap {
			p.snaps[v.name] = v
		} else {
			p.byName[v.name] = v
		}
		for _, c := range stale {
			if c.d.usable() {
				klog.InfoS("Releasing a superseded extent", "disk", c.d.path, "volume", v.name, "role", c.x.Role, "epoch", c.x.Epoch)
				off := c.x.Offset
				_ = p.writeLabel(c.d, func(l *Label) {
					out := l.Extents[:0:0]
					for _, x := range l.Extents {
						if x.Volume != u || x.Offset != off {
							out = append(out, x)
						}
					}
					l.Extents = out
				})
			}
		}
		if v.err == nil {
			p.assemble(v)
		}
		if v.err != nil {
			klog.ErrorS(v.err, "Volume not assembled", "volume", v.name, "volumeUUID", u)
		}
	}
}

// assemble opens the extent members of v's usable roles and assembles the array; the
// extents of its roles on present disks that may not serve go to the engine as witnesses
// (witnesses).
func (p *Pool) assemble(v *volume) {
	var members []raid10.Member
	var doubtful []bool // members on disks away at a start (away.go)
	for i, r := range v.roles {
		if r == nil || !r.disk.usable() {
			continue
		}
		m, err := raid10.NewExtentMember(r.disk.base, int64(r.ext.Offset), int64(r.ext.Length))
		if err != nil {
			v.err = fmt.Errorf("pool: volume %q role %d: %w", v.name, i, err)
			return
		}
		r.member = m
		members = append(members, m)
		doubtful = append(doubtful, r.disk.away)
	}
	arr, err := raid10.Assemble(members, raid10.AssembleOptions{Options: p.engineOptions(), UUID: v.uuid,
		Witnesses: p.witnesses(v), Doubtful: doubtful})
	if err != nil {
		v.err = fmt.Errorf("pool: assemble volume %q from %d of %d members: %w", v.name, len(members), v.members, err)
		return
	}
	if v.flags&ExtentFlagCopy != 0 {
		// The copy record's tail is not part of the volume.
		// An expand stopped after the engine grew the array leaves a longer tail: the
		// volume stays its old size until ExpandVolume is retried (growLocked).
		n := arr.Size() - int64(v.size)
		if n < raid10.CopyRecordSize || arr.Reserve(n) != nil {
			_ = arr.Close()
			v.err = fmt.Errorf("%w: %q: array of %d bytes for a copy target of %d", ErrFailedPrecondition, v.name, arr.Size(), v.size)
			return
		}
		v.arrTotal = v.size + uint64(n)
	}
	v.arr, v.err = arr, nil
	p.applyLimits(v)
	p.applyRates(v)
	h, _ := p.health(v)
	klog.InfoS("Volume assembled", "volume", v.name, "volumeUUID", v.uuid, "members", len(members), "of", v.members, "health", h)
}

// witnesses returns, for the engine's assembly of v (raid10.AssembleOptions.Witnesses),
// the extents of v's roles on present disks that may not serve: failed, or Removed with the
// role left on them (a replace that found v unassembled). Their superblocks still tell
// what the array went through, so a member that missed the writes such a disk took while
// that member was away is not trusted as in sync (pool matrix seed 1796199122708649481: a
// snapshot assembled late from the member that was away during its copy, its partner's
// disk failed since, served the snapshot as it was before the copy). Caller holds p.mu.
func (p *Pool) witnesses(v *volume) []raid10.Member {
	var out []raid10.Member
	for _, d := range p.disks {
		if d.usable() || !d.present || d.base == nil || d.label == nil {
			continue
		}
		for _, x := range d.label.Extents {
			r := int(x.Role)
			if x.Volume != v.uuid || r >= len(v.disks) || v.disks[r] != d.uuid {
				continue
			}
			if m, err := raid10.NewExtentMember(d.base, int64(x.Offset), int64(x.Length)); err == nil {
				out = append(out, m)
			}
		}
	}
	return out
}

// deletedAway returns a disk that v's member map names, that is present and Active and
// that holds no extent of v: v was deleted while its other disks were away (a delete
// removes the extents of the present disks only), and those disks' extents are what is
// left of it. nil when every usable member disk holds its role. A replace writes the new
// disk's extent before any member map names it, and a create or delete stopped half-way
// is flagged on every extent, so no live volume matches.
func (p *Pool) deletedAway(v *volume) *disk {
	for r, u := range v.disks {
		if v.roles[r] != nil {
			continue
		}
		for _, d := range p.disks {
			if d.uuid == u && d.usable() {
				return d
			}
		}
	}
	return nil
}

// releaseDeletedAway releases the extents on d, a disk that returned after Open (AddDisk),
// of the volumes deleted while it was away: the pool does not know the volume, and its
// member map names another present, Active disk that holds no extent of it (the delete
// removed the extents of the disks present then), the rule deletedAway applies at Open.
// Left on d, such an extent brought the deleted volume back at a later Open that went
// without that other disk. A volume the pool does not know because all of its other disks
// are away keeps its extents. Caller holds p.mu.
func (p *Pool) releaseDeletedAway(d *disk) {
	var gone []UUID
	for _, x := range d.label.Extents {
		u := x.Volume
		if p.volumes[u] != nil || slices.Contains(gone, u) {
			continue
		}
		if p.forgotten(d, x) {
			gone = append(gone, u)
		}
	}
	for _, u := range gone {
		klog.InfoS("Releasing the extents of a volume deleted while their disk was away", "volumeUUID", u, "disk", d.path)
		if err := p.finishDelete(u); err != nil {
			klog.ErrorS(err, "Finishing delete", "volumeUUID", u)
		}
	}
}

// forgotten reports whether x's member map names a disk other than d that is present and
// Active and holds no extent of x's volume. Caller holds p.mu.
func (p *Pool) forgotten(d *disk, x ExtentEntry) bool {
	holders := p.holdersOf(x.Volume)
	for _, m := range x.MemberDisks {
		for _, o := range p.disks {
			if o.uuid == m && o != d && o.usable() && !slices.Contains(holders, o) {
				return true
			}
		}
	}
	return false
}
