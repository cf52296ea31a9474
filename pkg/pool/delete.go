package pool

import (
	"fmt"
	"slices"

	"k8s.io/klog/v2"
)

// DeleteVolume closes a volume, releases its extents and discards them. Deleting a volume
// that does not exist succeeds.
//
// Durability order: every member's extent is first marked deleting in its label (a crash
// from here on makes Open finish the delete instead of assembling a partial volume), the
// extents are discarded, then the entries are removed.
func (p *Pool) DeleteVolume(name string) error {
	return p.deleteNamed(p.byName, "volume", name)
}

// DeleteSnapshot deletes a snapshot and frees its extents; a missing one is not an error. A
// snapshot being restored (the source of a volume whose copy runs) is ErrFailedPrecondition.
// A snapshot whose own copy runs is deleted: the copy stops and its hook leaves the volume.
func (p *Pool) DeleteSnapshot(name string) error {
	return p.deleteNamed(p.snaps, "snapshot", name)
}

// deleteNamed deletes the volume or snapshot (kind) that names (p.byName or p.snaps) holds
// under name; a missing one is not an error. The source of a running copy is
// ErrFailedPrecondition.
func (p *Pool) deleteNamed(names map[string]*volume, kind, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	v := names[name]
	if v == nil {
		return nil
	}
	if t := p.copyFromLocked(v); t != nil {
		return sourceInUse(kind, name, t)
	}
	if err := p.deleteLocked(v); err != nil {
		return fmt.Errorf("pool: delete %s %q: %w", kind, name, err)
	}
	delete(names, name)
	klog.InfoS("Deleted", "kind", kind, "name", name, "uuid", v.uuid)
	return nil
}

// sourceInUse is the refusal to delete the source (kind, name) of t's unfinished copy: the
// regions not copied yet exist only on the source. A copy that could not resume at Open
// (its source was not assembled) has no copier, and the refusal says so rather than
// reporting progress that is not being made.
func sourceInUse(kind, name string, t *volume) error {
	if t.copy == nil {
		return fmt.Errorf("%w: %s %q is the source of %s, whose copy is unfinished and stopped (it could not resume because %q was not assembled); the part not copied yet exists only on %q: delete %s first, or bring back the disks of %q so that the copy resumes when the pool next opens",
			ErrFailedPrecondition, kind, name, t.kindName(), name, name, t.kindName(), name)
	}
	return fmt.Errorf("%w: %s %q is the source of %s, whose copy is running (%d of %d bytes); delete it once that copy is done, or delete that first",
		ErrFailedPrecondition, kind, name, t.kindName(), t.copy.Copied(), t.size)
}

// deleteLocked deletes a volume or snapshot: its extents are marked deleting first (a
// copy into it that stops now can never be resumed from a source that went on changing),
// then the copy into it stops (its hooks go), the array closes, and the extents are
// discarded and removed; the pool forgets the volume and its scrub state (a running pass
// ends with the array's ErrClosed). Caller holds p.mu.
func (p *Pool) deleteLocked(v *volume) error {
	if v.copy != nil {
		if err := p.markDeleting(v.uuid); err != nil {
			return err
		}
		v.copy.Cancel()
	}
	if v.arr != nil {
		if err := v.arr.Close(); err != nil {
			klog.ErrorS(err, "Closing array before delete", "name", v.name)
		}
		v.arr = nil
	}
	if err := p.finishDelete(v.uuid); err != nil {
		return err
	}
	delete(p.volumes, v.uuid)
	delete(p.scrubs, v.uuid)
	delete(p.restored, v.uuid)
	delete(p.lastWindow, v.uuid)
	return nil
}

// spreadTombstone writes the tombstone of u to every present disk in service that is not
// one of holders (they have it already). A failure is logged: the holders carry it.
func (p *Pool) spreadTombstone(u UUID, holders []*disk) {
	for _, d := range p.disks {
		if !d.present || d.file == nil || (d.state != DiskActive && d.state != DiskSpare) || slices.Contains(holders, d) {
			continue
		}
		if err := p.writeLabel(d, nil); err != nil {
			klog.ErrorS(err, "Writing a tombstone", "disk", d.path, "volumeUUID", u)
		}
	}
}

// markDeleting flags every extent of u on the present disks deleting.
func (p *Pool) markDeleting(u UUID) error {
	for _, d := range p.holdersOf(u) {
		if err := p.writeLabel(d, flagExtents(u, ExtentFlagDeleting, 0)); err != nil {
			return err
		}
	}
	return nil
}

// finishDelete tombstones volume u, then marks, discards and removes every extent of it on
// the present disks. The tombstone goes with the first label written (the holders' marks)
// and then to every other present disk that is in service, so that whichever disks the
// next Open finds, one of them knows u is deleted (see tombstone.go).
func (p *Pool) finishDelete(u UUID) error {
	p.addTombstone(u)
	holders := p.holdersOf(u)
	for i, d := range holders {
		if i == 1 {
			if err := p.fail("delete.first-mark"); err != nil {
				return err
			}
		}
		if err := p.writeLabel(d, flagExtents(u, ExtentFlagDeleting, 0)); err != nil {
			return err
		}
	}
	p.spreadTombstone(u, holders)
	if err := p.fail("delete.marked"); err != nil {
		return err
	}
	for i, d := range holders {
		if i == 1 {
			if err := p.fail("delete.first-removed"); err != nil {
				return err
			}
		}
		for _, x := range d.label.Extents {
			if x.Volume == u {
				if err := d.file.discard(int64(x.Offset), int64(x.Length)); err != nil {
					klog.V(2).InfoS("Discard failed (advisory)", "disk", d.path, "err", err)
				}
			}
		}
		if err := p.writeLabel(d, func(l *Label) { l.Extents = removeVolume(l.Extents, u) }); err != nil {
			return err
		}
	}
	return nil
}
