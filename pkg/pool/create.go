package pool

import (
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

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
	disks, err := p.memberDisks(spec)
	if err != nil {
		return nil, err
	}
	c := p.newCreation(name, size, spec, len(disks))
	if err := p.placeExtents(c, disks); err != nil {
		return nil, err
	}
	// 1. Zero the extents, write the engine's superblocks (free space until step 2).
	if err := p.createArray(c); err != nil {
		return nil, err
	}
	if err := p.fail("create.engine"); err != nil {
		p.abandon(c.v, false)
		return nil, err
	}
	// 2. Flag the extent creating in each member disk's label.
	if err := p.labelCreating(c.v); err != nil {
		return nil, err
	}
	// 3. A copy target: write the copy record and make the cut.
	if spec.src != nil {
		if err := p.cutCopy(c.v, spec); err != nil {
			return nil, err
		}
	}
	// 4. Clear the flags: from here on Open assembles the volume.
	if err := p.clearCreating(c.v); err != nil {
		return nil, err
	}
	p.addLocked(c.v)
	srcName := ""
	if spec.src != nil {
		srcName = spec.src.name
	}
	klog.InfoS("Created", "kind", c.v.kind(), "name", name, "uuid", c.v.uuid, "size", size, "members", c.v.members,
		"chunkSize", spec.chunk, "extent", c.ext, "source", srcName)
	return c.v, nil
}

// creation is a volume or snapshot that createLocked is making.
type creation struct {
	v       *volume
	spec    createSpec
	arrSize uint64 // the array's size: the volume's, plus the copy record for a copy target
	ext     uint64 // the extent length on each member disk
}

// memberDisks chooses the disks of a new volume: spec.nMembs (0: every usable disk) of the
// usable ones, those with the largest free range first (ties: configuration order).
func (p *Pool) memberDisks(spec createSpec) ([]*disk, error) {
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
	if n < 2 || n > len(cands) {
		what := "volume"
		if spec.snap {
			what = "snapshot"
		}
		return nil, fmt.Errorf("%w: a %s over %d members needs that many healthy disks, the pool has %d",
			ErrNoSpace, what, max(n, 2), len(cands))
	}
	sort.SliceStable(cands, func(i, j int) bool { return largestFree(cands[i].label) > largestFree(cands[j].label) })
	return cands[:n], nil
}

// newCreation is the volume of n members that createLocked makes, with its flags and, for a
// copy target, its source; and the sizes of its array and extents.
func (p *Pool) newCreation(name string, size uint64, spec createSpec, n int) *creation {
	v := &volume{uuid: NewUUID(), name: name, size: size, members: n, roles: make([]*role, n), epoch: 1, snap: spec.snap}
	if spec.snap {
		v.flags |= ExtentFlagSnapshot
	}
	arrSize := size
	if src := spec.src; src != nil {
		arrSize += raid10.CopyRecordSize
		v.flags |= ExtentFlagCopy | ExtentFlagCopying
		copy(v.copySource[:], src.uuid[:8])
		v.srcUUID, v.copySize, v.srcName, v.srcLive = src.uuid, src.size, src.name, spec.live
	}
	return &creation{v: v, spec: spec, arrSize: arrSize, ext: p.extentLen(arrSize, n, spec.chunk)}
}

// placeExtents allocates an extent on each of disks and makes it the member of that role.
func (p *Pool) placeExtents(c *creation, disks []*disk) error {
	v := c.v
	for _, d := range disks {
		v.disks = append(v.disks, d.uuid)
	}
	for i, d := range disks {
		off, ok := allocate(d.label, c.ext, p.cfg.Allocation)
		if !ok {
			return fmt.Errorf("%w: %s of %d bytes needs %d bytes on each of %d disks; disk %s has at most %d free in one range (largest creatable volume: %d bytes)",
				ErrNoSpace, v.kindName(), v.size, c.ext, v.members, d.path, largestFree(d.label), p.capacityLocked().LargestVolume)
		}
		em, err := raid10.NewExtentMember(d.base, int64(off), int64(c.ext))
		if err != nil {
			return fmt.Errorf("pool: extent on %s: %w", d.path, err)
		}
		var m raid10.Member = em
		if p.wrapMember != nil {
			m = p.wrapMember(m)
		}
		v.roles[i] = &role{disk: d, member: m, ext: ExtentEntry{
			Volume: v.uuid, Offset: off, Length: c.ext, VolumeSize: v.size, Epoch: 1,
			Role: uint16(i), Members: uint16(v.members), Name: v.name, MemberDisks: v.disks,
			Flags: v.flags, CopySource: v.copySource,
		}}
	}
	return nil
}

// createArray zeroes the extents and creates the array over them; a copy target gets the
// copy record's room reserved. A member whose metadata write fails or hangs fails its disk,
// as such a member of a running array does (monitor): no new extent is placed on it until
// it is re-added, and an abandoned write that lands late reaches free space only.
//
// The extents are zeroed whole on every kind of disk (zeroExtents), so the array is created
// clean: both copies of every block already read zero, and the engine's initial resync,
// which would copy the first copy over the second (the previous contents of the extent on
// a block device), is skipped. Nothing a volume, snapshot or clone never wrote reads as
// anything but zeroes, the tail of a copy target past its source included.
func (p *Pool) createArray(c *creation) error {
	v := c.v
	members := make([]raid10.Member, len(v.roles))
	for i, r := range v.roles {
		members[i] = r.member
	}
	if err := p.zeroExtents(v.roles, c.ext); err != nil {
		return fmt.Errorf("pool: create %s: %w", v.kindName(), err)
	}
	arr, err := raid10.Create(members, raid10.CreateOptions{
		Options: p.engineOptions(), UUID: v.uuid, ChunkSize: int64(c.spec.chunk),
		Size: int64(c.arrSize), AssumeClean: true,
	})
	if err != nil {
		var me *raid10.MemberError
		if errors.As(err, &me) && me.Member >= 0 && me.Member < len(v.roles) {
			d := v.roles[me.Member].disk
			klog.InfoS("Disk failed while creating a volume", "disk", d.path, "diskUUID", d.uuid, "volume", v.name, "err", err)
			p.failDiskLocked(d, fmt.Sprintf("creating %s: %v", v.kindName(), err))
		}
		return fmt.Errorf("pool: create %s: %w", v.kindName(), err)
	}
	v.arr = arr
	if c.spec.src == nil {
		return nil
	}
	if err := arr.Reserve(raid10.CopyRecordSize); err != nil {
		p.abandon(v, false)
		return fmt.Errorf("pool: create %s: %w", v.kindName(), err)
	}
	v.arrTotal = v.size + raid10.CopyRecordSize
	return nil
}

// labelCreating adds the volume's extent, flagged creating, to each member disk's label. If
// one write fails, the labels already written are rolled back (the extents are free again)
// and the array closes.
func (p *Pool) labelCreating(v *volume) error {
	for i, r := range v.roles {
		if i == 1 {
			if err := p.fail("create.first-label"); err != nil {
				p.abandon(v, false)
				return err
			}
		}
		x := r.ext
		x.Flags |= ExtentFlagCreating
		if err := p.writeLabel(r.disk, func(l *Label) { l.Extents = append(l.Extents, x) }); err != nil {
			for _, w := range v.roles[:i] {
				_ = p.writeLabel(w.disk, func(l *Label) { l.Extents = removeVolume(l.Extents, v.uuid) })
			}
			p.abandon(v, false)
			return fmt.Errorf("pool: create %s: %w", v.kindName(), err)
		}
	}
	return nil
}

// cutCopy makes the cut of the copy into the new volume from spec.src (the copy record is
// written; the copier starts once the volume is added).
func (p *Pool) cutCopy(v *volume, spec createSpec) error {
	if err := p.startCopyLocked(v, spec.src, spec.live); err != nil {
		p.abandon(v, true)
		return fmt.Errorf("pool: create %s from %q: %w", v.kindName(), spec.src.name, err)
	}
	if err := p.fail("create.cut"); err != nil {
		p.abandon(v, false)
		return err
	}
	return nil
}

// clearCreating clears the creating flag of the volume's extent in each member disk's label.
func (p *Pool) clearCreating(v *volume) error {
	for i, r := range v.roles {
		if err := p.fail(fmt.Sprintf("create.clear-flag-%d", i)); err != nil {
			p.abandon(v, false)
			return err
		}
		if err := p.writeLabel(r.disk, flagExtents(v.uuid, 0, ExtentFlagCreating)); err != nil {
			p.abandon(v, true)
			return fmt.Errorf("pool: create %s: %w", v.kindName(), err)
		}
	}
	return nil
}

// abandon ends a create that failed after its array was made: the copy into it stops, the
// array closes. Without release the labels stay as they are, as if the process had died
// there (the failpoints; Open rolls the create back); with release the copy is cancelled
// and the extents are marked, discarded and removed.
func (p *Pool) abandon(v *volume, release bool) {
	if v.copy != nil {
		if release {
			v.copy.Cancel()
		} else {
			v.copy.Stop()
		}
	}
	_ = v.arr.Close()
	if release {
		_ = p.finishDelete(v.uuid)
	}
}

// addLocked makes a created volume or snapshot known by its UUID and name, and starts the
// copy into it.
func (p *Pool) addLocked(v *volume) {
	p.volumes[v.uuid] = v
	if v.snap {
		p.snaps[v.name] = v
	} else {
		p.byName[v.name] = v
	}
	if v.copy != nil {
		v.copy.Start()
	}
}

// zeroStep is how much of a new extent zeroExtents asks a disk to zero in one call. The
// member deadline applies to each call, so a device that writes the zeroes itself (no
// write-zeroes offload: the kernel then writes zero pages) shows progress well within it:
// 64 MiB take about 0.6 s at 100 MB/s.
const zeroStep = 64 << 20

// zeroing is the zeroing of one new extent: steps counts the zeroStep calls done (the
// progress the waiter watches), stop makes it end before its next call.
type zeroing struct {
	steps atomic.Int64
	stop  atomic.Bool
}

// zeroResult is how the zeroing of roles[i]'s extent ended.
type zeroResult struct {
	i   int
	err error
}

// zeroExtents zeroes the new extents, on every disk at once, waiting while each makes
// progress: a disk none of whose zeroing calls returns within the member deadline is failed
// (its zeroing may land later, on free space of a failed disk) and named in the error,
// which matches EIO; the others finish first, so nothing zeroes free space of a healthy
// disk after the create returned. Caller holds p.mu.
//
// Member.WriteZeroes guarantees zeroes: a zeroed or punched range on a file, BLKZEROOUT on
// a block device (the device's write-zeroes command, or zero pages written by the kernel
// where it has none), zero writes where neither works. A discard is not used: it is a hint
// and many devices keep the data. On a device without write-zeroes offload this writes
// every byte of the extent while p.mu is held (twice the volume's size, in place of the
// resync that a create without zeroing would run in the background).
func (p *Pool) zeroExtents(roles []*role, ext uint64) error {
	ch := make(chan zeroResult, len(roles))
	zs := make([]zeroing, len(roles))
	for i, r := range roles {
		go func() {
			var err error
			for off := int64(0); off < int64(ext) && err == nil && !zs[i].stop.Load(); off += zeroStep {
				err = r.member.WriteZeroes(off, min(zeroStep, int64(ext)-off))
				zs[i].steps.Add(1)
			}
			ch <- zeroResult{i, err}
		}()
	}
	deadline := p.engineOptions().MemberTimeout
	if deadline == 0 {
		deadline = raid10.DefaultMemberTimeout
	}
	var tick <-chan time.Time
	if deadline > 0 {
		t := time.NewTicker(deadline / 4)
		defer t.Stop()
		tick = t.C
	}
	seen, moved := make([]int64, len(roles)), make([]time.Time, len(roles))
	for i := range moved {
		moved[i] = time.Now()
	}
	ended := make([]bool, len(roles)) // finished, or given up on
	var firstErr error
	for waiting := len(roles); waiting > 0; {
		select {
		case res := <-ch:
			if ended[res.i] {
				continue // a disk already failed, whose last call returned late
			}
			ended[res.i] = true
			waiting--
			if res.err != nil && firstErr == nil {
				firstErr = fmt.Errorf("zero extent on %s: %w", roles[res.i].disk.path, res.err)
			}
		case now := <-tick:
			for i, r := range roles {
				if ended[i] {
					continue
				}
				if n := zs[i].steps.Load(); n != seen[i] {
					seen[i], moved[i] = n, now
					continue
				}
				if now.Sub(moved[i]) < deadline {
					continue
				}
				zs[i].stop.Store(true)
				ended[i] = true
				waiting--
				err := fmt.Errorf("%w: disk %s did not answer zeroing a new extent within %v", raid10.ErrIO, r.disk.path, deadline)
				klog.ErrorS(err, "Disk failed while creating a volume", "disk", r.disk.path, "diskUUID", r.disk.uuid)
				p.failDiskLocked(r.disk, err.Error())
				if firstErr == nil {
					firstErr = err
				}
			}
		}
	}
	return firstErr
}
