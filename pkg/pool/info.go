package pool

import (
	"sort"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// health computes a volume's health and sync progress. Caller holds p.mu.
func (p *Pool) health(v *volume) (Health, *Progress) {
	if v.arr == nil {
		return Failed, nil
	}
	return healthOf(v.arr.Status())
}

// memberHealth is a volume's health from its members alone, bad blocks left out: Healthy
// when every member is in sync. Caller holds p.mu.
func (p *Pool) memberHealth(v *volume) Health {
	if v.arr == nil {
		return Failed
	}
	st := v.arr.Status()
	st.BadBlocks, st.LostBlocks = 0, 0
	h, _ := healthOf(st)
	return h
}

// volumeInfo snapshots a volume. Caller holds p.mu.
func (p *Pool) volumeInfo(v *volume) VolumeInfo {
	if v.arr == nil {
		return p.volumeInfoOf(v, nil)
	}
	st := v.arr.Status() // one snapshot: the health agrees with the counts
	return p.volumeInfoOf(v, &st)
}

// volumeInfoOf describes v with its array's status st (nil when v has no array). Caller
// holds p.mu.
func (p *Pool) volumeInfoOf(v *volume, sp *raid10.Status) VolumeInfo {
	vi := VolumeInfo{Name: v.name, UUID: v.uuid.String(), Size: v.size, Health: Failed, Scrub: p.scrubInfo(v),
		Source: p.sourceInfo(v), Hydrated: !v.copying() && v.flags&ExtentFlagCopyFailed == 0, Copied: v.copied()}
	var st raid10.Status
	if sp != nil {
		st = *sp
		vi.Health, vi.Sync = healthOf(st)
		vi.ChunkSize = uint64(st.ChunkSize)
		vi.BadBlocks, vi.LostBlocks = st.BadBlocks, st.LostBlocks
		if st.Limits != (raid10.Limits{}) {
			vi.Limits = &st.Limits
		}
		if vi.Limits != nil || st.Throttle != (raid10.ThrottleStatus{}) {
			vi.Throttle = &st.Throttle
		}
	} else if v.err != nil {
		vi.Reason = v.err.Error()
	}
	if err := p.copyRefusal(v); err != nil && sp != nil {
		// Assembled, but its copy failed while it ran: it is not served again (servable).
		vi.Health, vi.Reason = Failed, err.Error()
	}
	for i, r := range v.roles {
		mi := MemberInfo{Role: i, State: raid10.MemberMissing.String()}
		if i < len(st.Members) {
			ms := st.Members[i]
			mi.State, mi.BadBlocks, mi.TimedOut, mi.SlowLastCopy = ms.State.String(), ms.BadBlocks, ms.TimedOut, ms.SlowLastCopy
			vi.TimedOut += ms.TimedOut
			if ms.State == raid10.MemberInSync {
				vi.InSync++
			}
		}
		if i < len(v.disks) {
			mi.DiskUUID = v.disks[i].String()
			for _, d := range p.disks {
				if d.uuid == v.disks[i] {
					mi.DiskPath = d.path
				}
			}
		}
		if r != nil {
			mi.Offset, mi.Length = r.ext.Offset, r.ext.Length
		}
		vi.Members = append(vi.Members, mi)
	}
	return vi
}

// Volumes lists every volume, sorted by name.
func (p *Pool) Volumes() []VolumeInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return describeSorted(p.byName, p.volumeInfo)
}

// describeSorted describes every volume or snapshot of names (p.byName or p.snaps), sorted
// by name. Caller holds p.mu.
func describeSorted[T any](names map[string]*volume, describe func(*volume) T) []T {
	keys := make([]string, 0, len(names))
	for name := range names {
		keys = append(keys, name)
	}
	sort.Strings(keys)
	out := make([]T, 0, len(keys))
	for _, name := range keys {
		out = append(out, describe(names[name]))
	}
	return out
}

// Volume describes one volume.
func (p *Pool) Volume(name string) (VolumeInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.volumeNamed(name)
	if err != nil {
		return VolumeInfo{}, err
	}
	return p.volumeInfo(v), nil
}

// Array returns the volume's array, the block device to serve (it implements pkg/nbd's
// Backend with FUA, discard and write-zeroes). It stays the same object across disk
// failures and rebuilds; it is closed by DeleteVolume and Close. A volume that does not
// hold its source's data (its copy failed, or is stopped) is refused with
// ErrFailedPrecondition saying so (servable); one not assembled with its assembly's error.
func (p *Pool) Array(name string) (*raid10.Array, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.volumeNamed(name)
	if err != nil {
		return nil, err
	}
	if err := p.servable(v); err != nil {
		return nil, err
	}
	return v.arr, nil
}

// Disks lists every disk: claimed, missing, refused.
func (p *Pool) Disks() []DiskInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]DiskInfo, 0, len(p.disks))
	for _, d := range p.disks {
		out = append(out, p.diskInfo(d))
	}
	return out
}

func (p *Pool) diskInfo(d *disk) DiskInfo {
	di := DiskInfo{Path: d.path, Identity: d.ident, Size: d.size}
	if !d.uuid.IsZero() {
		di.UUID = d.uuid.String()
	}
	switch {
	case d.refused != nil:
		di.Status, di.Reason = StatusRefused, d.refused.Error()
	case !d.present:
		di.Status = StatusMissing
		if d.state == DiskRemoved {
			di.Status = StatusRemoved
		}
	default:
		di.Status = DiskStatus(d.state.String())
		if !d.listed {
			// Only without Config.DisksFile: with it, every disk given at run time is recorded.
			di.Reason = "not in the configured disk list and no disksFile is set: add it (or a glob matching it) or a restart will not find it"
		}
	}
	if l := d.label; l != nil && d.present {
		di.DataSize = l.DataEnd - l.DataStart
		di.Free = totalFree(l)
		di.Used = di.DataSize - di.Free
		di.Extents = len(l.Extents)
	}
	return di
}

// Capacity reports the pool's capacity.
func (p *Pool) Capacity() Capacity {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.capacityLocked()
}

func (p *Pool) capacityLocked() Capacity {
	var c Capacity
	n := 0
	var minLargest uint64
	for _, d := range p.disks {
		if !d.present || d.label == nil {
			continue
		}
		area := d.label.DataEnd - d.label.DataStart
		switch d.state {
		case DiskSpare:
			c.Spare += area
		case DiskActive:
			c.Raw += area
			c.FreeRaw += totalFree(d.label)
			lf := largestFree(d.label)
			if n == 0 || lf < minLargest {
				minLargest = lf
			}
			n++
		}
	}
	c.Usable, c.FreeUsable = c.Raw/2, c.FreeRaw/2
	if n >= 2 {
		c.LargestVolume = p.volumeFor(minLargest, n)
	}
	return c
}

// Status snapshots the whole pool.
func (p *Pool) Status() Status {
	s := Status{Capacity: p.Capacity(), Disks: p.Disks(), Volumes: p.Volumes(), Snapshots: p.Snapshots()}
	p.mu.Lock()
	s.UUID, s.Name = p.uuid.String(), p.name
	p.mu.Unlock()
	return s
}
