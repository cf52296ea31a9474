package raid10

import (
	"fmt"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// Grow raises the usable size of the running array to newSize bytes (a
// multiple of BlockSize) while I/O goes on. The near-2 layout maps array
// chunk c to (member, row) independently of the member size, so growing
// only appends rows: every existing chunk stays where it is.
//
// Every member must already be large enough (Member.Size() >= data offset +
// the new per-member data size; see ExtentMember.Resize), else the error
// wraps ErrMemberTooSmall and names the slot. A smaller newSize is
// ErrInvalid, the same size a no-op. Grow is refused with ErrBusy while a
// resync, recovery or scrub runs, and while the array is not optimal (a
// degraded array is grown after its recovery). The write-intent bitmap gets
// the regions the new size needs, within the space reserved between the
// bitmap offset and the data offset; an array whose bitmap cannot grow
// there (a tiny region size) gets ErrInvalid.
//
// Durability order:
//  1. the newly exposed range is zeroed on both copies (Member.WriteZeroes,
//     a hole punch or zero-range on file members) and the members flushed,
//     so the copies agree there and the new range reads as zeroes;
//  2. with every barrier bucket drained (I/O paused for the metadata writes
//     only), the new bitmap blocks (all clear) are written and flushed on
//     every live member;
//  3. the superblocks with the new geometry are written and flushed on every
//     live member (events bumped);
//  4. only then is the new size published to the fast path.
//
// A crash before 3 leaves the array at its old size; a crash during 3
// leaves some superblocks with the old sizes, which Assemble accepts as
// older than the freshest view.
func (a *Array) Grow(newSize int64) error {
	if newSize <= 0 || newSize%BlockSize != 0 {
		return invalidf("grow to %d bytes: not a positive multiple of %d", newSize, BlockSize)
	}
	// Close waits for slowOps, so the array is not torn down under Grow.
	a.slowOps.Add(1)
	defer a.slowOps.Add(-1)
	if a.closed.Load() {
		return ErrClosed
	}
	if a.hooks.Load() != nil {
		return fmt.Errorf("%w: cannot grow while a copy (snapshot, clone, restore) from or into the array runs", ErrBusy)
	}
	if !a.syncRun.TryLock() {
		return fmt.Errorf("%w: cannot grow while a resync, recovery or scrub runs", ErrBusy)
	}
	defer a.syncRun.Unlock()
	// geo's size fields change only here, under syncRun: reading them is safe.
	old := a.geo
	switch {
	case newSize < old.size:
		return invalidf("grow to %d bytes: smaller than the array (%d); shrinking is not supported", newSize, old.size)
	case newSize == old.size:
		return nil
	}
	if a.resyncActive.Load() || !a.allInSync() || a.State() == ArrayFailed {
		return fmt.Errorf("%w: cannot grow an array that is not optimal (resync pending, degraded or recovering)", ErrBusy)
	}
	geo, err := grownGeometry(old, newSize)
	if err != nil {
		return err
	}
	refs, err := a.growMembers(geo)
	if err != nil {
		return err
	}
	// 1. Zero the new range on both copies. Nothing reads or writes it yet:
	// I/O is checked against the old size, and syncs are held off.
	if err := zeroGrownRange(old, geo, refs); err != nil {
		return err
	}

	// 2.-4. with every bucket drained.
	a.freeze()
	defer a.thaw()
	b := a.bm
	b.mu.Lock()
	defer b.mu.Unlock()
	b.idle()
	if err := b.growBlocks(geo.regions); err != nil {
		return err
	}
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	if err := a.recordGrowLocked(old, geo); err != nil {
		return err
	}
	a.publishGrow(geo)
	klog.V(1).InfoS("raid10: grown", "size", newSize, "oldSize", old.size, "dataSize", geo.dataSize, "regions", geo.regions)
	return nil
}

// grownGeometry is old grown to newSize bytes: rows appended to every
// member, and the bitmap blocks the new regions need, which must fit
// between the bitmap offset and the data offset.
func grownGeometry(old geometry, newSize int64) (geometry, error) {
	chunk := old.chunk
	chunks := (newSize + chunk - 1) / chunk
	oldDevChunks := old.dataSize / chunk
	devChunks := max(oldDevChunks, (chunks*nearCopies+int64(old.n)-1)/int64(old.n))
	dataSize := devChunks * chunk
	regions := (newSize + old.region - 1) / old.region
	bmBytes := max(old.bmBytes, (regions+bmBitsPerBlock-1)/bmBitsPerBlock*sbSize)
	if bitmapOffset+bmBytes > old.dataOffset {
		return geometry{}, invalidf("grow to %d bytes: the bitmap for %d regions needs %d bytes, only %d are reserved before the data offset %d",
			newSize, regions, bmBytes, old.dataOffset-bitmapOffset, old.dataOffset)
	}
	return newGeometry(old.n, chunk, old.dataOffset, dataSize, newSize, old.region, bmBytes), nil
}

// growMembers returns every slot's live member, each large enough for geo.
func (a *Array) growMembers(geo geometry) ([]*memberRef, error) {
	need := geo.dataOffset + geo.dataSize
	refs := make([]*memberRef, len(a.slots))
	for i, s := range a.slots {
		refs[i] = s.live()
		if refs[i] == nil {
			return nil, fmt.Errorf("%w: slot %d has no member", ErrBusy, i)
		}
		if sz := refs[i].m.Size(); sz < need {
			return nil, fmt.Errorf("%w: member in slot %d has %d bytes, growing to %d needs %d", ErrMemberTooSmall, i, sz, geo.size, need)
		}
	}
	return refs, nil
}

// zeroGrownRange zeroes what geo adds to old on both copies (the tail of
// the last old rows, then the new rows of every member) and flushes the
// members.
func zeroGrownRange(old, geo geometry, refs []*memberRef) error {
	zero := func(slot int, off, length int64) error {
		if length <= 0 {
			return nil
		}
		if err := refs[slot].m.WriteZeroes(off, length); err != nil {
			return fmt.Errorf("%w: %w", ErrIO, &MemberError{Member: slot, Op: "grow: zero new range", Err: err})
		}
		return nil
	}
	chunk, newSize := old.chunk, geo.size
	chunks := (newSize + chunk - 1) / chunk
	oldDevChunks := old.dataSize / chunk
	for c := old.size / chunk; c < chunks && c*nearCopies/int64(old.n) < oldDevChunks; c++ {
		from := max(old.size, c*chunk) - c*chunk
		to := min(chunk, newSize-c*chunk)
		d0, d1, o0, o1 := geo.mapChunk(c)
		if err := zero(d0, o0+from, to-from); err != nil {
			return err
		}
		if err := zero(d1, o1+from, to-from); err != nil {
			return err
		}
	}
	for i := range refs {
		if err := zero(i, old.dataOffset+old.dataSize, geo.dataSize-old.dataSize); err != nil {
			return err
		}
	}
	for i, r := range refs {
		if err := r.m.Flush(); err != nil {
			return fmt.Errorf("%w: %w", ErrIO, &MemberError{Member: i, Op: "grow: flush", Err: err})
		}
	}
	return nil
}

// growBlocks appends the clear bitmap blocks that regions need and writes
// them to every live member (step 2 of Grow). Caller holds b.mu, idle.
func (b *bitmap) growBlocks(regions int64) error {
	oldBlocks := int64(len(b.image)) * 8 / bmBitsPerBlock
	newBlocks := (regions + bmBitsPerBlock - 1) / bmBitsPerBlock
	if newBlocks <= oldBlocks {
		return nil
	}
	b.image = append(b.image, make([]byte, (newBlocks-oldBlocks)*bmBitsPerBlock/8)...)
	blocks := make(map[int64]bool)
	for blk := oldBlocks; blk < newBlocks; blk++ {
		blocks[blk] = true
	}
	if err := b.writeBlocks(blocks); err != nil {
		return fmt.Errorf("grow: write bitmap: %w", err)
	}
	return nil
}

// recordGrowLocked writes the superblocks with the new geometry (step 3 of
// Grow); on failure the array keeps its old sizes. Caller holds metaMu,
// with every bucket drained.
func (a *Array) recordGrowLocked(old, geo geometry) error {
	// A member that failed meanwhile may have missed the zeroing: it must
	// not come back by a bitmap re-add into a grown array. Nothing is
	// recorded yet; the caller retries once the array is optimal.
	if !a.allInSync() || a.stateLocked() == ArrayFailed {
		return fmt.Errorf("%w: a member failed while growing; the size is unchanged", ErrBusy)
	}
	// Only the size fields change: the fast path reads the others (chunk,
	// chunkShift, ...) before it enters a bucket.
	a.setSizes(geo)
	a.writeSuperblocksLocked(true, false)
	if a.stateLocked() == ArrayFailed {
		// Not recorded anywhere usable; keep serving the old size.
		a.setSizes(old)
		return fmt.Errorf("%w: grow: the new geometry could not be recorded", ErrIO)
	}
	return nil
}

// publishGrow gives the bitmap states and the resync bits their new
// regions and then publishes the new size to the fast path (step 4 of
// Grow). Caller holds the bitmap lock and metaMu, with every bucket
// drained.
func (a *Array) publishGrow(geo geometry) {
	b := a.bm
	oldSt := b.states()
	st := make([]atomic.Uint32, geo.regions)
	for r := range oldSt {
		st[r].Store(oldSt[r].Load())
	}
	b.stp.Store(&st)
	if w := (geo.regions + 63) / 64; w > int64(len(a.resyncNeed())) {
		rn := make([]atomic.Uint64, w)
		need := a.resyncNeed()
		for i := range need {
			rn[i].Store(need[i].Load())
		}
		a.resyncNeedP.Store(&rn)
	}
	a.size.Store(geo.size)
}

func (a *Array) setSizes(g geometry) {
	a.geo.dataSize, a.geo.size, a.geo.chunks, a.geo.regions, a.geo.bmBytes = g.dataSize, g.size, g.chunks, g.regions, g.bmBytes
}
