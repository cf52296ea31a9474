package pool

import (
	"fmt"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// grower is the engine method ExpandVolume needs: grow the array to newSize bytes after
// every member grew (md near-2 places chunk k at row 2k/N of the grid, so more rows at the
// end leave every existing chunk where it is). *raid10.Array implements it; the check stays
// so that an engine without it is reported clearly.
type grower interface {
	// Grow raises the array's size to newSize; every member must already be large enough.
	Grow(newSize int64) error
}

var (
	_ grower  = (*raid10.Array)(nil)
	_ resizer = (*raid10.ExtentMember)(nil)
)

// resizer is what an extent member needs to grow in place under a running array (the
// array keeps the member object it was given).
type resizer interface {
	// Resize sets the member's length; the range must stay inside its base.
	Resize(length int64) error
}

// readdMember puts m back into slot; the engine copies only the regions its bitmap marks
// when m's superblock is recent enough, everything otherwise.
func (p *Pool) readdMember(v *volume, slot int, m raid10.Member) error {
	return v.arr.ReplaceMember(slot, m)
}

// growLocked grows every member extent of v to ext bytes in place, then the array.
//
// Order: the labels are written with the longer extents first (the space is reserved; a
// crash leaves a volume of the old size with spare room, and a retried expand continues),
// then the engine grows (a copy target's tail moves: growCopyTail), then the labels record
// the new volume size. A crash after the engine grew leaves the array longer than the
// labels' size: a copy target reserves the difference (assemble, v.arrTotal) and a retried
// expand, to that size or a smaller one, continues from there.
func (p *Pool) growLocked(v *volume, newSize, ext uint64) (VolumeInfo, error) {
	g, ok := any(v.arr).(grower)
	for _, r := range v.roles {
		if _, rok := r.member.(resizer); !rok {
			ok = false
		}
	}
	if !ok {
		return VolumeInfo{}, fmt.Errorf("%w: volume %q: there is room to grow in place, but the RAID10 engine cannot grow a running array yet",
			ErrFailedPrecondition, v.name)
	}
	setLen := func(length, size uint64) func(l *Label) {
		return func(l *Label) {
			for i := range l.Extents {
				if l.Extents[i].Volume == v.uuid {
					l.Extents[i].Length = max(l.Extents[i].Length, length)
					l.Extents[i].VolumeSize = size
				}
			}
		}
	}
	for _, r := range v.roles {
		// Never shorter than the member is: an expand to a larger size may have grown it.
		ext := max(ext, r.ext.Length)
		if err := p.writeLabel(r.disk, setLen(ext, v.size)); err != nil {
			return VolumeInfo{}, err
		}
		if err := r.member.(resizer).Resize(int64(ext)); err != nil {
			return VolumeInfo{}, fmt.Errorf("pool: grow extent on %s: %w", r.disk.path, err)
		}
		r.ext.Length = ext
	}
	arrSize := newSize
	if v.flags&ExtentFlagCopy != 0 {
		// The tail stays reserved; an array an interrupted expand grew further stays so.
		arrSize = max(newSize+raid10.CopyRecordSize, v.arrTotal)
	}
	if err := g.Grow(int64(arrSize)); err != nil {
		return VolumeInfo{}, fmt.Errorf("pool: grow volume %q: %w", v.name, err)
	}
	if err := p.fail("grow.engine"); err != nil {
		return VolumeInfo{}, err
	}
	if v.flags&ExtentFlagCopy != 0 {
		if err := p.growCopyTail(v, newSize, arrSize); err != nil {
			return VolumeInfo{}, err
		}
	}
	if err := p.fail("grow.zeroed"); err != nil {
		return VolumeInfo{}, err
	}
	for _, r := range v.roles {
		if err := p.writeLabel(r.disk, setLen(ext, newSize)); err != nil {
			return VolumeInfo{}, err
		}
		r.ext.VolumeSize = newSize
	}
	v.size = newSize
	klog.InfoS("Volume expanded", "volume", v.name, "size", newSize)
	return p.volumeInfo(v), nil
}

// growCopyTail moves copy target v's reserved tail to the end of its grown array of arrSize
// bytes, past newSize, and zeroes the old one. The old tail (a finished copy's record) is
// volume space now: it reads zero. The new tail's head, where a record would be, lies in
// the range the growth zeroed: no record there means a finished copy. The zeroes are flushed
// before growLocked's labels record the new size. Caller holds p.mu.
func (p *Pool) growCopyTail(v *volume, newSize, arrSize uint64) error {
	v.arrTotal = arrSize
	if err := v.arr.Reserve(int64(arrSize - newSize)); err != nil {
		return fmt.Errorf("pool: grow volume %q: reserve the copy record: %w", v.name, err)
	}
	if err := v.arr.WriteZeroes(int64(v.size), raid10.CopyRecordSize); err != nil {
		return fmt.Errorf("pool: grow volume %q: zero the old copy record: %w", v.name, err)
	}
	// Durable before the labels say the volume is larger: the disks' write caches would
	// otherwise lose the zeroes in a power cut while the labels survive, and the old
	// record's bytes would be volume data after the restart.
	if err := v.arr.Flush(); err != nil {
		return fmt.Errorf("pool: grow volume %q: flush the zeroed copy record: %w", v.name, err)
	}
	return nil
}
