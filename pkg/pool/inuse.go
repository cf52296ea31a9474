package pool

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// inUseRetryInterval is how often the monitor tries again the disks refused because another
// open file held their lock.
const inUseRetryInterval = 2 * time.Second

// returnFreedLocked tries again each disk refused because another open file held its lock:
// typically the process before this one, whose write abandoned in a hung disk has not landed
// yet (openBase). A disk that now opens, carries this pool's label and names a disk the pool
// misses comes back as a returning disk does (AddDisk): its volumes re-add it and resync only
// what changed while it was away. A disk that opens but is not one of this pool's missing
// disks stays refused, with that reason: only an operator's disk add claims a disk. Caller
// holds p.mu.
func (p *Pool) returnFreedLocked() {
	for _, d := range append([]*disk(nil), p.disks...) {
		if d.present || d.path == "" || !errors.Is(d.refused, ErrDiskInUse) {
			continue
		}
		f, err := p.openDisk(d.path)
		if err != nil {
			if !errors.Is(err, ErrDiskInUse) {
				d.refused = err
			}
			continue
		}
		ls := readLabel(f.f)
		into := p.missingEntry(ls.label)
		if into == nil {
			_ = f.close()
			d.refused = fmt.Errorf("%w: disk %s is no longer in use, but it carries no label of a disk this pool misses; offer it with disk add", ErrFailedPrecondition, d.path)
			klog.InfoS("Disk no longer in use, still refused", "disk", d.path, "reason", d.refused)
			continue
		}
		if _, err := p.returnDisk(into, f, ls, d.cfg); err != nil {
			klog.ErrorS(err, "Disk no longer in use, not returned", "disk", d.path)
			continue
		}
		klog.InfoS("Disk no longer in use, returned", "disk", d.path, "diskUUID", into.uuid)
	}
}

// missingEntry is the pool's entry of the missing disk that label l names, nil when l is
// not a label of this pool or names no missing disk.
func (p *Pool) missingEntry(l *Label) *disk {
	if l == nil || l.Pool != p.uuid {
		return nil
	}
	for _, o := range p.disks {
		if o.uuid == l.Disk && !o.present {
			return o
		}
	}
	return nil
}

// dropDisk removes d from the pool's list (a refused entry whose disk came back under
// another entry, returnDisk).
func (p *Pool) dropDisk(d *disk) {
	kept := p.disks[:0]
	for _, o := range p.disks {
		if o != d {
			kept = append(kept, o)
		}
	}
	p.disks = kept
}
