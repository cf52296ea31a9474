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
	chunk := old.chunk
	chunks := (newSize + chunk - 1) / chunk
	oldDevChunks := old.dataSize / chunk
	devChunks := max(oldDevChunks, (chunks*nearCopies+int64(old.n)-1)/int64(old.n))
	dataSize := devChunks * chunk
	regions := (newSize + old.region - 1) / old.region
	bmBytes := max(old.bmBytes, (regions+bmBitsPerBlock-1)/bmBitsPerBlock*sbSize)
	if bitmapOffset+bmBytes > old.dataOffset {
		return invalidf("grow to %d bytes: the bitmap for %d regions needs %d bytes, only %d are reserved before the data offset %d",
			newSize, regions, bmBytes, old.dataOffset-bitmapOffset, old.dataOffset)
	}
	need := old.dataOffset + dataSize
	refs := make([]*memberRef, len(a.slots))
	for i, s := range a.slots {
		refs[i] = s.live()
		if refs[i] == nil {
			return fmt.Errorf("%w: slot %d has no member", ErrBusy, i)
		}
		if sz := refs[i].m.Size(); sz < need {
			return fmt.Errorf("%w: member in slot %d has %d bytes, growing to %d needs %d", ErrMemberTooSmall, i, sz, newSize, need)
		}
	}
	geo := newGeometry(old.n, chunk, old.dataOffset, dataSize, newSize, old.region, bmBytes)

	// 1. Zero the new range on both copies. Nothing reads or writes it yet:
	// I/O is checked against the old size, and syncs are held off.
	zero := func(slot int, off, length int64) error {
		if length <= 0 {
			return nil
		}
		if err := refs[slot].m.WriteZeroes(off, length); err != nil {
			return fmt.Errorf("%w: %w", ErrIO, &MemberError{Member: slot, Op: "grow: zero new range", Err: err})
		}
		return nil
	}
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
	for i := range a.slots {
		if err := zero(i, old.dataOffset+old.dataSize, dataSize-old.dataSize); err != nil {
			return err
		}
	}
	for i, r := range refs {
		if err := r.m.Flush(); err != nil {
			return fmt.Errorf("%w: %w", ErrIO, &MemberError{Member: i, Op: "grow: flush", Err: err})
		}
	}

	// 2.-4. with every bucket drained.
	a.freeze()
	defer a.thaw()
	b := a.bm
	b.mu.Lock()
	defer b.mu.Unlock()
	b.idle()
	oldBlocks := int64(len(b.image)) * 8 / bmBitsPerBlock
	newBlocks := (regions + bmBitsPerBlock - 1) / bmBitsPerBlock
	if newBlocks > oldBlocks {
		b.image = append(b.image, make([]byte, (newBlocks-oldBlocks)*bmBitsPerBlock/8)...)
		blocks := make(map[int64]bool)
		for blk := oldBlocks; blk < newBlocks; blk++ {
			blocks[blk] = true
		}
		if err := b.writeBlocks(blocks); err != nil {
			return fmt.Errorf("grow: write bitmap: %w", err)
		}
	}
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
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
	oldSt := b.states()
	st := make([]atomic.Uint32, regions)
	for r := range oldSt {
		st[r].Store(oldSt[r].Load())
	}
	b.stp.Store(&st)
	if w := (regions + 63) / 64; w > int64(len(a.resyncNeed())) {
		rn := make([]atomic.Uint64, w)
		need := a.resyncNeed()
		for i := range need {
			rn[i].Store(need[i].Load())
		}
		a.resyncNeedP.Store(&rn)
	}
	a.size.Store(newSize)
	klog.V(1).InfoS("raid10: grown", "size", newSize, "oldSize", old.size, "dataSize", dataSize, "regions", regions)
	return nil
}

func (a *Array) setSizes(g geometry) {
	a.geo.dataSize, a.geo.size, a.geo.chunks, a.geo.regions, a.geo.bmBytes = g.dataSize, g.size, g.chunks, g.regions, g.bmBytes
}
