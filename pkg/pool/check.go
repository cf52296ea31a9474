package pool

import (
	"context"
	"errors"
	"fmt"
)

// Check proves the pool consistent, for tests after faults and for operators: every present
// disk's label re-reads equal to the in-memory one from disk (both slots decode, at least
// one is current), extents lie in the data area without overlap, every volume's entries
// agree on name, size and member count, no role is held twice, every volume's array is
// assembled, no volume the pool knows is tombstoned (deleted) and, for a Healthy volume,
// the engine's scrub finds no mismatch.
func (p *Pool) Check() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	type key struct {
		v    UUID
		role uint16
	}
	holders := map[key]ExtentEntry{}
	for _, d := range p.disks {
		if !d.present || d.file == nil {
			continue
		}
		ls := readLabel(d.file.f)
		if ls.label == nil {
			errs = append(errs, fmt.Errorf("disk %s: %w", d.path, ls.err()))
			continue
		}
		if ls.label.Generation != d.label.Generation || ls.slot != d.slot {
			errs = append(errs, fmt.Errorf("disk %s: on-disk label generation %d in slot %d, in memory %d in slot %d",
				d.path, ls.label.Generation, ls.slot, d.label.Generation, d.slot))
		}
		if err := ls.label.check(); err != nil {
			errs = append(errs, fmt.Errorf("disk %s: %w", d.path, err))
		}
		if d.state != DiskActive {
			continue
		}
		for _, x := range ls.label.Extents {
			k := key{x.Volume, x.Role}
			if _, ok := holders[k]; ok {
				errs = append(errs, fmt.Errorf("volume %s role %d held twice", x.Volume, x.Role))
			}
			holders[k] = x
			v := p.volumes[x.Volume]
			switch {
			case v == nil:
				errs = append(errs, fmt.Errorf("disk %s: extent of unknown volume %s (%q)", d.path, x.Volume, x.Name))
			case x.Name != v.name || x.VolumeSize != v.size || int(x.Members) != v.members || x.Epoch != v.epoch:
				errs = append(errs, fmt.Errorf("disk %s: extent of volume %q disagrees: name %q size %d members %d epoch %d",
					d.path, v.name, x.Name, x.VolumeSize, x.Members, x.Epoch))
			case v.disks[x.Role] != d.uuid:
				errs = append(errs, fmt.Errorf("disk %s: stale extent of volume %q role %d", d.path, v.name, x.Role))
			}
		}
	}
	for _, v := range p.volumes {
		if p.tombstoned(v.uuid) {
			errs = append(errs, fmt.Errorf("volume %q (%s) is known but tombstoned (deleted)", v.name, v.uuid))
		}
		if v.arr == nil {
			errs = append(errs, fmt.Errorf("volume %q not assembled: %w", v.name, v.err))
			continue
		}
		if h, _ := healthOf(v.arr.Status()); h != Healthy {
			continue
		}
		res, err := v.arr.Check(context.Background())
		if err != nil {
			errs = append(errs, fmt.Errorf("volume %q: scrub: %w", v.name, err))
		} else if res.Mismatches != 0 {
			errs = append(errs, fmt.Errorf("volume %q: scrub found %d mismatched blocks", v.name, res.Mismatches))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("pool: check failed: %w", errors.Join(errs...))
	}
	return nil
}
