package pool

import "k8s.io/klog/v2"

// A disk away at a start (missing or refused) may miss writes: the volumes with a role on
// it run degraded, and only their members present then know it, in their superblocks. If a
// later start has the away disk back but one of those members away in turn, nothing
// present would know, and the engine would trust the returned member's old data (a mirror
// that flips between its two halves). So the pool records the absence in the disk table,
// on every disk (DiskFlagAway), before anything runs without the disk, and hands the
// disk's members to the engine as doubtful (raid10.AssembleOptions.Doubtful): one alone in
// its mirror, with no fresh view vouching for it, is not trusted. The flag is cleared once
// every volume with a role on the disk is assembled with that role: the engine has then
// recorded in its superblocks whether the member is in sync.

// markAway flags every Active disk of the table that is not present (Open, before the
// table is written and before any volume is assembled). It reports whether a flag changed.
func (p *Pool) markAway() bool {
	changed := false
	for _, d := range p.disks {
		if !d.present && d.state == DiskActive && !d.away {
			d.away, changed = true, true
			klog.InfoS("Disk away at start: its members are doubtful until each volume on it is assembled with them", "diskUUID", d.uuid, "path", d.path)
		}
	}
	return changed
}

// clearAway clears the flag of every present, Active disk whose every extent belongs to a
// volume assembled with that extent's member, and writes the table if a flag changed.
// Caller holds p.mu (or is Open).
func (p *Pool) clearAway() {
	changed := false
	for _, d := range p.disks {
		if !d.away || !d.usable() || d.label == nil {
			continue
		}
		vouched := true
		for _, x := range d.label.Extents {
			v := p.volumes[x.Volume]
			r := int(x.Role)
			if v != nil && r < len(v.disks) && v.disks[r] != d.uuid {
				continue // superseded: its role moved on while the disk was away
			}
			if v == nil || v.arr == nil || r >= len(v.roles) || v.roles[r] == nil || v.roles[r].member == nil {
				vouched = false
				break
			}
		}
		if vouched {
			d.away, changed = false, true
			klog.InfoS("Disk back in every volume with a role on it: no longer doubtful", "disk", d.path, "diskUUID", d.uuid)
		}
	}
	if changed {
		if err := p.writeTable(true); err != nil {
			klog.ErrorS(err, "Recording returned disks in the disk table")
		}
	}
}
