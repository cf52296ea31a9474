package pool

import (
	"errors"
	"fmt"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// Volume size limits.
const (
	// SizeGranularity: volume sizes are rounded up to a multiple of it.
	SizeGranularity = 1 << 20
	// MaxVolumeSize is the largest size CreateVolume and ExpandVolume accept (256 TiB: the
	// engine's bitmap for it still fits the 1 MiB metadata head of an extent).
	MaxVolumeSize = 1 << 48
	// extentMetaSize is what the engine keeps at the head of each member (superblocks and
	// write-intent bitmap, padded to its 1 MiB data alignment).
	extentMetaSize = 1 << 20
)

// Extent entry flags.
const (
	// ExtentFlagDeleting marks the extents of a volume being deleted; Open finishes the
	// delete.
	ExtentFlagDeleting = 1
	// ExtentFlagCreating marks the extents of a volume whose create has not returned yet;
	// Open rolls such a volume back (the caller never saw it; a retry creates it again).
	ExtentFlagCreating = 2
	// ExtentFlagSnapshot marks the extents of a snapshot: an array of the pool that is not a
	// volume (never served; listed by Snapshots).
	ExtentFlagSnapshot = 4
	// ExtentFlagCopy marks a copy target (a snapshot, or a volume created from a source):
	// its array is CopyRecordSize bytes longer than VolumeSize, and that tail holds the copy
	// record (docs/on-disk-format.md, "Copy record").
	ExtentFlagCopy = 8
	// ExtentFlagCopying: the copy into the target has not finished (the record says how far
	// it got); Open puts the copy hooks back before anything is served.
	ExtentFlagCopying = 16
	// ExtentFlagCopyFailed: the copy into the target failed; it does not hold its source's
	// data (a snapshot reads Failed, a volume is not assembled).
	ExtentFlagCopyFailed = 32
)

// flagExtents returns a label change that sets set and clears clear in the flags of every
// extent of volume u.
func flagExtents(u UUID, set, clear uint32) func(l *Label) {
	return func(l *Label) {
		for i := range l.Extents {
			if l.Extents[i].Volume == u {
				l.Extents[i].Flags = l.Extents[i].Flags&^clear | set
			}
		}
	}
}

// removeVolume returns xs without the extents of volume u.
func removeVolume(xs []ExtentEntry, u UUID) []ExtentEntry {
	out := xs[:0:0]
	for _, x := range xs {
		if x.Volume != u {
			out = append(out, x)
		}
	}
	return out
}

// holdersOf lists the present disks whose label holds an extent of volume u.
func (p *Pool) holdersOf(u UUID) []*disk {
	var holders []*disk
	for _, d := range p.disks {
		if !d.present || d.label == nil {
			continue
		}
		for _, x := range d.label.Extents {
			if x.Volume == u {
				holders = append(holders, d)
				break
			}
		}
	}
	return holders
}

// role is one member slot of a volume.
type role struct {
	disk   *disk
	ext    ExtentEntry
	member raid10.Member // extent member over disk.base; nil while the disk is missing
}

// volume is a RAID10 array over one extent on each of its member disks.
type volume struct {
	uuid    UUID
	name    string
	size    uint64
	members int
	epoch   uint64        // member map version (ExtentEntry.Epoch)
	disks   []UUID        // member map: the disk holding each role, present or not
	roles   []*role       // by slot; nil when the role's disk is not present or not usable
	arr     *raid10.Array // nil when the volume could not be assembled
	err     error         // why arr is nil
	// arrTotal is a copy target's array size with the tail it reserves past the volume
	// (Array.Reserve): CopyRecordSize, the copy record at its head; more after an expand
	// stopped between the engine's growth and the labels (the labels keep the old size).
	arrTotal uint64
	// limits are the QoS limits set on it (SetVolumeLimits), applied at every assembly.
	limits raid10.Limits
	// rates are the background rates set on it (SetVolumeRates), applied at every assembly.
	rates raid10.Rates
	// scrubSchedule is its own scrub schedule (SetVolumeScrubSchedule, defaults filled in);
	// nil: the node's.
	scrubSchedule *ScrubConfig

	// Snapshots and copies (snapshot.go).
	snap       bool         // a snapshot, not a volume
	flags      uint32       // the set's persistent extent flags (ExtentFlagSnapshot...)
	copySource [8]byte      // ExtentEntry.CopySource
	copy       *raid10.Copy // the copy into this array, while it runs (and after, until reopened)
	copyErr    error        // why the copy failed, when this process saw it fail
	srcUUID    UUID         // the copy's source
	srcName    string       // the source's name at the cut (the copy record keeps it)
	srcLive    bool         // the source was a volume (a live cut), not a snapshot
	copySize   uint64       // bytes the copy fills (the source's size; 0: v.size)
	cutAt      time.Time    // the copy's cut
}

// memberDataSize is the data each of n members holds for a volume of size bytes with the
// given chunk size (md near-2: n members hold n*data/2).
func memberDataSize(size uint64, n int, chunk uint64) uint64 {
	return alignUp((2*size+uint64(n)-1)/uint64(n), chunk)
}

func (p *Pool) chunkSize() uint64 {
	if p.cfg.ChunkSize > 0 {
		return uint64(p.cfg.ChunkSize)
	}
	return raid10.DefaultChunkSize
}

// volumeChunk is the chunk size of an existing volume: its array's, or the pool's while it
// is not assembled.
func (p *Pool) volumeChunk(v *volume) uint64 {
	if v.arr != nil {
		return uint64(v.arr.ChunkSize())
	}
	return p.chunkSize()
}

// extentLen is the extent length each of n members needs for a volume of size bytes with
// the given chunk size.
func (p *Pool) extentLen(size uint64, n int, chunk uint64) uint64 {
	return alignUp(extentMetaSize+memberDataSize(size, n, chunk), uint64(p.cfg.Alignment))
}

// volumeFor is the largest volume size that extents of length ext on n members hold.
func (p *Pool) volumeFor(ext uint64, n int) uint64 {
	if ext <= extentMetaSize {
		return 0
	}
	data := alignDown(ext-extentMetaSize, p.chunkSize())
	return alignDown(data*uint64(n)/2, SizeGranularity)
}

func (p *Pool) engineOptions() raid10.Options {
	return raid10.Options{SyncRateMax: p.cfg.RebuildRateMax, MemberTimeout: time.Duration(p.cfg.MemberTimeout)}
}

// checkSize validates and rounds a requested size.
func checkSize(size uint64) (uint64, error) {
	if size == 0 || size > MaxVolumeSize {
		return 0, fmt.Errorf("%w: size %d: must be from 1 byte to %d bytes", ErrInvalidArgument, size, uint64(MaxVolumeSize))
	}
	return alignUp(size, SizeGranularity), nil
}

// ExpandVolume grows a volume in place to at least newSize bytes (rounded up to 1 MiB):
// every member's extent must have enough free space right after it. Shrinking is refused;
// the same size is a no-op. Every member must be in sync (the volume Healthy but for bad
// blocks, which the engine keeps across a growth).
func (p *Pool) ExpandVolume(name string, newSize uint64) (VolumeInfo, error) {
	newSize, err := checkSize(newSize)
	if err != nil {
		return VolumeInfo{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.openVolumeLocked(name)
	if err != nil {
		return VolumeInfo{}, err
	}
	switch {
	case newSize == v.size:
		return p.volumeInfo(v), nil
	case newSize < v.size:
		return VolumeInfo{}, fmt.Errorf("%w: volume %q is %d bytes; shrinking to %d is not supported", ErrInvalidArgument, name, v.size, newSize)
	}
	if h := p.memberHealth(v); h != Healthy {
		return VolumeInfo{}, fmt.Errorf("%w: volume %q is %s; expand it once it is Healthy", ErrDegraded, name, h)
	}
	if v.copying() {
		return VolumeInfo{}, fmt.Errorf("%w: volume %q is still being copied from its source (%d of %d bytes); expand it once hydrated",
			ErrFailedPrecondition, name, v.copied(), v.size)
	}
	if t := p.copyFromLocked(v); t != nil {
		return VolumeInfo{}, fmt.Errorf("%w: volume %q is the source of %s, whose copy is running; expand it once that copy is done",
			ErrFailedPrecondition, name, t.kindName())
	}
	arrSize := newSize
	if v.flags&ExtentFlagCopy != 0 {
		arrSize += raid10.CopyRecordSize
	}
	ext := p.extentLen(arrSize, v.members, p.volumeChunk(v))
	for _, r := range v.roles {
		if ext <= r.ext.Length {
			continue
		}
		if g := growable(r.disk.label, r.ext.Offset); g < ext-r.ext.Length {
			return VolumeInfo{}, fmt.Errorf("%w: volume %q cannot grow in place to %d bytes: disk %s has %d bytes free after the volume's extent, %d needed",
				ErrNoSpace, name, newSize, r.disk.path, g, ext-r.ext.Length)
		}
	}
	return p.growLocked(v, newSize, ext)
}

// volumeNamed returns the volume called name; ErrNotFound when there is none. Caller holds
// p.mu.
func (p *Pool) volumeNamed(name string) (*volume, error) {
	if v := p.byName[name]; v != nil {
		return v, nil
	}
	return nil, fmt.Errorf("%w: volume %q", ErrNotFound, name)
}

// openVolumeLocked is volumeNamed on an open pool: ErrClosed after Close. Caller holds p.mu.
func (p *Pool) openVolumeLocked(name string) (*volume, error) {
	if p.closed {
		return nil, ErrClosed
	}
	return p.volumeNamed(name)
}

// UsableDisks is a helper for callers that want to know how many disks a default
// CreateVolume would use.
func (p *Pool) UsableDisks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, d := range p.disks {
		if d.usable() {
			n++
		}
	}
	return n
}

// errNotAssembled is wrapped when a volume has no array.
var errNotAssembled = errors.New("pool: volume not assembled")
