package pool

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"k8s.io/klog/v2"

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

	// Snapshots and copies (snapshot.go).
	snap       bool         // a snapshot, not a volume
	flags      uint32       // the set's persistent extent flags (ExtentFlagSnapshot...)
	copySource [8]byte      // ExtentEntry.CopySource
	copy       *raid10.Copy // the copy into this array, while it runs (and after, until reopened)
	srcUUID    UUID         // the copy's source
	srcName    string       // the source's name at the cut (the copy record keeps it)
	srcLive    bool         // the source was a volume (a live cut), not a snapshot
	copySize   uint64       // bytes the copy fills (the source's size; 0: v.size)
	cutAt      time.Time    // the copy's cut
}

// Chunk size limits of CreateOptions.ChunkSize (the StorageClass parameter chunkSize).
const (
	MinChunkSize = 4 << 10
	MaxChunkSize = 16 << 20
)

// CreateOptions are the parameters of a new volume.
type CreateOptions struct {
	// Members is the number of member disks; 0 means every Active disk (at least two).
	Members int
	// ChunkSize is the RAID10 chunk size in bytes: a power of two from MinChunkSize to
	// MaxChunkSize. 0 means the pool's (Config.ChunkSize, else the engine's default). The
	// engine records it in every member's superblock; it never changes.
	ChunkSize int64
	// Source, when set, fills the new volume from a snapshot (restore) or from another
	// volume (clone, as of the create); nil: an empty volume.
	Source *Source
}

// createSpec is what createLocked makes besides a plain volume.
type createSpec struct {
	snap   bool
	src    *volume // copy source (nil: an empty volume)
	live   bool    // cut src while served (a snapshot or a clone of a volume)
	chunk  uint64
	nMembs int
}

// checkChunkSize validates CreateOptions.ChunkSize (0 passes: the pool's default).
func checkChunkSize(c int64) error {
	if c != 0 && (c < MinChunkSize || c > MaxChunkSize || c&(c-1) != 0) {
		return fmt.Errorf("%w: chunk size %d: must be a power of two from %d to %d bytes", ErrInvalidArgument, c, MinChunkSize, MaxChunkSize)
	}
	return nil
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

// CreateVolume creates a volume of at least size bytes (rounded up to 1 MiB) over one
// extent on each of opts.Members disks, with opts.ChunkSize chunks. It is idempotent by name:
// an existing volume of the same name and (rounded) size is returned; another size, or
// another chunk size asked for explicitly, is ErrAlreadyExists.
//
// Durability order: the extents are zeroed and the engine writes its superblocks into them
// first (free space, harmless if the process dies here), then each member disk's label gets
// the extent flagged creating, then the flags are cleared; only then is the volume
// returned. Open rolls back a volume that still has a creating extent anywhere.
func (p *Pool) CreateVolume(name string, size uint64, opts CreateOptions) (VolumeInfo, error) {
	if err := ValidateName(name); err != nil {
		return VolumeInfo{}, err
	}
	size, err := checkSize(size)
	if err != nil {
		return VolumeInfo{}, err
	}
	if err := checkChunkSize(opts.ChunkSize); err != nil {
		return VolumeInfo{}, err
	}
	if s := opts.Source; s != nil && (s.Snapshot == "") == (s.Volume == "") {
		return VolumeInfo{}, fmt.Errorf("%w: volume %q: a source names exactly one snapshot or one volume (snapshot %q, volume %q)",
			ErrInvalidArgument, name, s.Snapshot, s.Volume)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return VolumeInfo{}, ErrClosed
	}
	chunk := p.chunkSize()
	if opts.ChunkSize != 0 {
		chunk = uint64(opts.ChunkSize)
	}
	if p.snaps[name] != nil {
		return VolumeInfo{}, fmt.Errorf("%w: %q is the name of a snapshot", ErrAlreadyExists, name)
	}
	if v := p.byName[name]; v != nil {
		if v.size != size {
			return VolumeInfo{}, fmt.Errorf("%w: volume %q has size %d, requested %d", ErrAlreadyExists, name, v.size, size)
		}
		if have := p.volumeChunk(v); opts.ChunkSize != 0 && v.arr != nil && have != chunk {
			return VolumeInfo{}, fmt.Errorf("%w: volume %q has chunk size %d, requested %d", ErrAlreadyExists, name, have, chunk)
		}
		switch s := opts.Source; {
		case s == nil && v.flags&ExtentFlagCopy != 0:
			return VolumeInfo{}, fmt.Errorf("%w: volume %q exists, filled from a source", ErrAlreadyExists, name)
		case s != nil && v.flags&ExtentFlagCopy == 0:
			return VolumeInfo{}, fmt.Errorf("%w: volume %q exists without a source", ErrAlreadyExists, name)
		case s != nil && !v.sameSource(*s, p.lookupSource(*s)):
			return VolumeInfo{}, fmt.Errorf("%w: volume %q exists with another source", ErrAlreadyExists, name)
		}
		return p.volumeInfo(v), nil
	}
	var src *volume
	if s := opts.Source; s != nil {
		if src, err = p.copySourceLocked(*s); err != nil {
			return VolumeInfo{}, fmt.Errorf("volume %q: %w", name, err)
		}
	}
	if src != nil && size < src.size {
		return VolumeInfo{}, fmt.Errorf("%w: volume %q of %d bytes is smaller than its source %q (%d bytes)", ErrInvalidArgument, name, size, src.name, src.size)
	}
	n := opts.Members
	if n != 0 && (n < 2 || n > raid10.MaxMembers) {
		return VolumeInfo{}, fmt.Errorf("%w: members %d: must be from 2 to %d", ErrInvalidArgument, n, raid10.MaxMembers)
	}
	spec := createSpec{src: src, live: src != nil && !src.snap, chunk: chunk, nMembs: n}
	v, err := p.createLocked(name, size, spec)
	if err != nil {
		return VolumeInfo{}, err
	}
	return p.volumeInfo(v), nil
}

// createLocked allocates and creates the array of a volume or snapshot; with a source,
// the copy's cut is made before the creating flags are cleared. Caller holds p.mu.
//
// Durability order: the extents are zeroed and the engine writes its superblocks into them
// first (free space, harmless if the process dies here), then each member disk's label gets
// the extent flagged creating, then (a copy) the copy record is written and the cut made,
// then the flags are cleared; only then does it return. Open rolls back a volume that
// still has a creating extent anywhere.
func (p *Pool) createLocked(name string, size uint64, spec createSpec) (*volume, error) {
	var cands []*disk
	for _, d := range p.disks {
		if d.usable() {
			cands = append(cands, d)
		}
	}
	n := spec.nMembs
	if n == 0 {
		n = len(cands)
	}
	what := "volume"
	if spec.snap {
		what = "snapshot"
	}
	if n < 2 || n > len(cands) {
		return nil, fmt.Errorf("%w: a %s over %d members needs that many healthy disks, the pool has %d",
			ErrNoSpace, what, max(n, 2), len(cands))
	}
	chunk := spec.chunk
	// Prefer the disks with the largest free range (ties: configuration order).
	sort.SliceStable(cands, func(i, j int) bool { return largestFree(cands[i].label) > largestFree(cands[j].label) })
	cands = cands[:n]
	arrSize := size
	v := &volume{uuid: NewUUID(), name: name, size: size, members: n, roles: make([]*role, n), epoch: 1, snap: spec.snap}
	if spec.snap {
		v.flags |= ExtentFlagSnapshot
	}
	if spec.src != nil {
		arrSize += raid10.CopyRecordSize
		v.flags |= ExtentFlagCopy | ExtentFlagCopying
		copy(v.copySource[:], spec.src.uuid[:8])
		v.srcUUID, v.copySize, v.srcName, v.srcLive = spec.src.uuid, spec.src.size, spec.src.name, spec.live
	}
	ext := p.extentLen(arrSize, n, chunk)
	for _, d := range cands {
		v.disks = append(v.disks, d.uuid)
	}
	for i, d := range cands {
		off, ok := allocate(d.label, ext, p.cfg.Allocation)
		if !ok {
			return nil, fmt.Errorf("%w: %s %q of %d bytes needs %d bytes on each of %d disks; disk %s has at most %d free in one range (largest creatable volume: %d bytes)",
				ErrNoSpace, what, name, size, ext, n, d.path, largestFree(d.label), p.capacityLocked().LargestVolume)
		}
		em, err := raid10.NewExtentMember(d.base, int64(off), int64(ext))
		if err != nil {
			return nil, fmt.Errorf("pool: extent on %s: %w", d.path, err)
		}
		var m raid10.Member = em
		if p.wrapMember != nil {
			m = p.wrapMember(m)
		}
		v.roles[i] = &role{disk: d, member: m, ext: ExtentEntry{
			Volume: v.uuid, Offset: off, Length: ext, VolumeSize: size, Epoch: 1,
			Role: uint16(i), Members: uint16(n), Name: name, MemberDisks: v.disks,
			Flags: v.flags, CopySource: v.copySource,
		}}
	}
	// Fresh extents must read back equal on both copies to skip the initial resync: zero
	// them where that is cheap (files: a punched range); devices get a background resync.
	assumeClean := true
	members := make([]raid10.Member, n)
	for i, r := range v.roles {
		members[i] = r.member
		assumeClean = assumeClean && !r.disk.file.isBlock
	}
	if err := p.zeroExtents(v.roles, ext); err != nil {
		return nil, fmt.Errorf("pool: create %s %q: %w", what, name, err)
	}
	arr, err := raid10.Create(members, raid10.CreateOptions{
		Options: p.engineOptions(), UUID: v.uuid, ChunkSize: int64(chunk),
		Size: int64(arrSize), AssumeClean: assumeClean,
	})
	if err != nil {
		// A member whose metadata write failed or hung fails its disk, as such a member
		// of a running array does (monitor): no new extent is placed on it until it is
		// re-added, and an abandoned write that lands late reaches free space only.
		var me *raid10.MemberError
		if errors.As(err, &me) && me.Member >= 0 && me.Member < len(v.roles) {
			d := v.roles[me.Member].disk
			klog.InfoS("Disk failed while creating a volume", "disk", d.path, "diskUUID", d.uuid, "volume", name, "err", err)
			p.failDiskLocked(d, fmt.Sprintf("creating %s %q: %v", what, name, err))
		}
		return nil, fmt.Errorf("pool: create %s %q: %w", what, name, err)
	}
	v.arr = arr
	if spec.src != nil {
		if err := arr.Reserve(raid10.CopyRecordSize); err != nil {
			_ = arr.Close()
			return nil, fmt.Errorf("pool: create %s %q: %w", what, name, err)
		}
		if !assumeClean && size > spec.src.size {
			// The tail past the source reads zero.
			if err := arr.WriteZeroes(int64(spec.src.size), int64(size-spec.src.size)); err != nil {
				_ = arr.Close()
				return nil, fmt.Errorf("pool: create %s %q: zero the tail: %w", what, name, err)
			}
		}
	}
	if err := p.fail("create.engine"); err != nil {
		_ = arr.Close()
		return nil, err
	}
	for i, r := range v.roles {
		if i == 1 {
			if err := p.fail("create.first-label"); err != nil {
				_ = arr.Close()
				return nil, err
			}
		}
		x := r.ext
		x.Flags |= ExtentFlagCreating
		if err := p.writeLabel(r.disk, func(l *Label) { l.Extents = append(l.Extents, x) }); err != nil {
			// Roll back the labels already written; the extents become free again.
			for _, w := range v.roles[:i] {
				_ = p.writeLabel(w.disk, func(l *Label) { l.Extents = removeVolume(l.Extents, v.uuid) })
			}
			_ = arr.Close()
			return nil, fmt.Errorf("pool: create %s %q: %w", what, name, err)
		}
	}
	if spec.src != nil {
		if err := p.startCopyLocked(v, spec.src, spec.live); err != nil {
			_ = arr.Close()
			_ = p.finishDelete(v.uuid)
			return nil, fmt.Errorf("pool: create %s %q from %q: %w", what, name, spec.src.name, err)
		}
		if err := p.fail("create.cut"); err != nil {
			v.copy.Stop()
			_ = arr.Close()
			return nil, err
		}
	}
	for i, r := range v.roles {
		if err := p.fail(fmt.Sprintf("create.clear-flag-%d", i)); err != nil {
			if v.copy != nil {
				v.copy.Stop()
			}
			_ = arr.Close()
			return nil, err
		}
		if err := p.writeLabel(r.disk, func(l *Label) {
			for i := range l.Extents {
				if l.Extents[i].Volume == v.uuid {
					l.Extents[i].Flags &^= ExtentFlagCreating
				}
			}
		}); err != nil {
			if v.copy != nil {
				v.copy.Cancel()
			}
			_ = arr.Close()
			_ = p.finishDelete(v.uuid)
			return nil, fmt.Errorf("pool: create %s %q: %w", what, name, err)
		}
	}
	p.volumes[v.uuid] = v
	if v.snap {
		p.snaps[name] = v
	} else {
		p.byName[name] = v
	}
	if v.copy != nil {
		v.copy.Start()
	}
	klog.InfoS("Created", "kind", what, "name", name, "uuid", v.uuid, "size", size, "members", n, "chunkSize", chunk, "extent", ext,
		"source", func() string {
			if spec.src != nil {
				return spec.src.name
			}
			return ""
		}())
	return v, nil
}

// zeroExtents zeroes the new extents on file disks (a punched range; devices get a
// background resync instead), all at once, waiting up to the member deadline: a disk that
// does not answer in time is failed (its zeroing may land later, on free space of a failed
// disk) and named in the error, which matches EIO. Caller holds p.mu.
func (p *Pool) zeroExtents(roles []*role, ext uint64) error {
	type result struct {
		i   int
		err error
	}
	ch := make(chan result, len(roles))
	waiting := 0
	for i, r := range roles {
		if r.disk.file.isBlock {
			continue
		}
		waiting++
		go func() { ch <- result{i, r.member.WriteZeroes(0, int64(ext))} }()
	}
	deadline := p.engineOptions().MemberTimeout
	if deadline == 0 {
		deadline = raid10.DefaultMemberTimeout
	}
	var timeout <-chan time.Time
	if deadline > 0 {
		t := time.NewTimer(deadline)
		defer t.Stop()
		timeout = t.C
	}
	done := make([]bool, len(roles))
	var firstErr error
	for ; waiting > 0; waiting-- {
		select {
		case res := <-ch:
			done[res.i] = true
			if res.err != nil && firstErr == nil {
				firstErr = fmt.Errorf("zero extent on %s: %w", roles[res.i].disk.path, res.err)
			}
		case <-timeout:
			for i, r := range roles {
				if r.disk.file.isBlock || done[i] {
					continue
				}
				err := fmt.Errorf("%w: disk %s did not answer zeroing a new extent within %v", raid10.ErrIO, r.disk.path, deadline)
				klog.ErrorS(err, "Disk failed while creating a volume", "disk", r.disk.path, "diskUUID", r.disk.uuid)
				p.failDiskLocked(r.disk, err.Error())
				if firstErr == nil {
					firstErr = err
				}
			}
			return firstErr
		}
	}
	return firstErr
}

func removeVolume(xs []ExtentEntry, u UUID) []ExtentEntry {
	out := xs[:0:0]
	for _, x := range xs {
		if x.Volume != u {
			out = append(out, x)
		}
	}
	return out
}

// DeleteVolume closes a volume, releases its extents and discards them. Deleting a volume
// that does not exist succeeds.
//
// Durability order: every member's extent is first marked deleting in its label (a crash
// from here on makes Open finish the delete instead of assembling a partial volume), the
// extents are discarded, then the entries are removed.
func (p *Pool) DeleteVolume(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	v := p.byName[name]
	if v == nil {
		return nil
	}
	if t := p.copyFromLocked(v); t != nil {
		return fmt.Errorf("%w: volume %q is the source of %s, whose copy is running (%d of %d bytes); delete it once that copy is done, or delete that first",
			ErrFailedPrecondition, name, t.kindName(), t.copy.Copied(), t.size)
	}
	if err := p.deleteLocked(v); err != nil {
		return fmt.Errorf("pool: delete volume %q: %w", name, err)
	}
	delete(p.byName, name)
	delete(p.scrubs, v.uuid) // a running pass ends with the array's ErrClosed
	delete(p.restored, v.uuid)
	delete(p.lastWindow, v.uuid)
	klog.InfoS("Volume deleted", "volume", name, "volumeUUID", v.uuid)
	return nil
}

// deleteLocked deletes a volume or snapshot: its extents are marked deleting first (a
// copy into it that stops now can never be resumed from a source that went on changing),
// then the copy into it stops (its hooks go), the array closes, and the extents are
// discarded and removed. Caller holds p.mu.
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
	return nil
}

// markDeleting flags every extent of u on the present disks deleting.
func (p *Pool) markDeleting(u UUID) error {
	for _, d := range p.disks {
		if !d.present || d.label == nil {
			continue
		}
		for _, x := range d.label.Extents {
			if x.Volume == u {
				if err := p.writeLabel(d, func(l *Label) {
					for i := range l.Extents {
						if l.Extents[i].Volume == u {
							l.Extents[i].Flags |= ExtentFlagDeleting
						}
					}
				}); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

// finishDelete marks, discards and removes every extent of volume u on the present disks.
func (p *Pool) finishDelete(u UUID) error {
	mark := func(l *Label) {
		for i := range l.Extents {
			if l.Extents[i].Volume == u {
				l.Extents[i].Flags |= ExtentFlagDeleting
			}
		}
	}
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
	for i, d := range holders {
		if i == 1 {
			if err := p.fail("delete.first-mark"); err != nil {
				return err
			}
		}
		if err := p.writeLabel(d, mark); err != nil {
			return err
		}
	}
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
	if p.closed {
		return VolumeInfo{}, ErrClosed
	}
	v := p.byName[name]
	if v == nil {
		return VolumeInfo{}, fmt.Errorf("%w: volume %q", ErrNotFound, name)
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
