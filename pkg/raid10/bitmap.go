package raid10

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Region state word: bit 31 = the region's bit is set on disk, bit 30 =
// clear candidate (idle since the last sweep), bits 0..29 = writes in
// flight in the region.
const (
	bmOnDisk uint32 = 1 << 31
	bmCand   uint32 = 1 << 30
)

// bitmap is the in-memory write-intent bitmap. The fast path is one atomic
// add per write on the region's state word (and one at the end); the mutex
// is taken only for the first write into a clean region and by the sweeper.
type bitmap struct {
	a *Array
	// stp holds the region state words; Array.Grow replaces the slice
	// (with every bucket drained and b.mu held), so readers load it.
	stp atomic.Pointer[[]atomic.Uint32]

	mu      sync.Mutex
	cond    *sync.Cond // signalled when a group commit ends
	writing bool       // a group commit is writing blocks
	pending []int64    // regions set in image, not yet written
	image   []byte     // bits, bmBitsPerBlock per block, LSB first
}

func newBitmap(a *Array) *bitmap {
	blocks := (a.geo.regions + bmBitsPerBlock - 1) / bmBitsPerBlock
	b := &bitmap{
		a:     a,
		image: make([]byte, blocks*bmBitsPerBlock/8),
	}
	st := make([]atomic.Uint32, a.geo.regions)
	b.stp.Store(&st)
	b.cond = sync.NewCond(&b.mu)
	return b
}

// startWrite must precede every write into region r; endWrite follows it.
// The first write into a clean region persists its bit on every live
// member (write + flush) before the data write may start.
func (b *bitmap) startWrite(r int64) error {
	st, durable := b.count(r)
	if durable {
		return nil
	}
	if err := b.persist(r); err != nil {
		st.Add(^uint32(0))
		return err
	}
	return nil
}

// tryStartWrite is startWrite when region r's bit is already durable, and
// false (nothing taken) when the first write into a clean region would have
// to persist it first.
func (b *bitmap) tryStartWrite(r int64) bool {
	st, durable := b.count(r)
	if !durable {
		st.Add(^uint32(0))
	}
	return durable
}

// count counts a write into region r and reports whether r's bit is
// durable already (then a sweeper's clearing candidate mark is dropped).
func (b *bitmap) count(r int64) (*atomic.Uint32, bool) {
	st := &b.states()[r]
	v := st.Add(1)
	if v&bmOnDisk == 0 {
		return st, false
	}
	if v&bmCand != 0 {
		st.And(^bmCand)
	}
	return st, true
}

func (b *bitmap) states() []atomic.Uint32 { return *b.stp.Load() }

func (b *bitmap) endWrite(r int64) { b.states()[r].Add(^uint32(0)) }

// persist makes region r's bit durable. Bits are group-committed: one
// goroutine at a time (the writer) writes the blocks of every bit set so
// far, without holding the mutex during the I/O; goroutines whose bits
// arrive meanwhile wait on the condition and are covered by the next batch.
func (b *bitmap) persist(r int64) error {
	st := &b.states()[r]
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if st.Load()&bmOnDisk != 0 {
			st.And(^bmCand)
			return nil
		}
		if b.image[r/8]&(1<<(r%8)) == 0 {
			b.image[r/8] |= 1 << (r % 8)
			b.pending = append(b.pending, r)
		}
		if !b.writing {
			break
		}
		b.cond.Wait()
	}
	b.writing = true
	var err error
	for len(b.pending) > 0 {
		regions := b.pending
		b.pending = nil
		blocks := make(map[int64]bool)
		for _, x := range regions {
			blocks[x/bmBitsPerBlock] = true
		}
		bufs := b.marshal(blocks)
		b.mu.Unlock()
		werr := b.writeMarshaled(bufs)
		b.mu.Lock()
		for _, x := range regions {
			if werr != nil {
				// Not durable: drop the bit; a waiter for x retries.
				b.image[x/8] &^= 1 << (x % 8)
				if x == r {
					err = werr
				}
			} else {
				b.states()[x].Or(bmOnDisk)
			}
		}
	}
	b.writing = false
	b.cond.Broadcast()
	return err
}

// idle waits until no group commit is writing, so the caller (holding
// b.mu) may write bitmap blocks itself. Caller holds b.mu.
func (b *bitmap) idle() {
	for b.writing {
		b.cond.Wait()
	}
}

type blockBuf struct {
	blk int64
	buf []byte
}

// marshal encodes the given blocks of the image. Caller holds b.mu.
func (b *bitmap) marshal(blocks map[int64]bool) []blockBuf {
	out := make([]blockBuf, 0, len(blocks))
	for blk := range blocks {
		lo := blk * bmBitsPerBlock / 8
		bb := blockBuf{blk: blk, buf: AlignedBuffer(sbSize)}
		marshalBitmapBlock(bb.buf, uint32(blk), b.image[lo:lo+bmBitsPerBlock/8])
		out = append(out, bb)
	}
	return out
}

// writeBlocks writes the given blocks of the image. Caller holds b.mu and
// has waited for idle.
func (b *bitmap) writeBlocks(blocks map[int64]bool) error {
	return b.writeMarshaled(b.marshal(blocks))
}

// writeMarshaled writes encoded bitmap blocks to every live member and
// flushes them. It fails only if no in-sync member took the blocks; members
// that fail are failed.
func (b *bitmap) writeMarshaled(bufs []blockBuf) error {
	a := b.a
	var refs [MaxMembers]*memberRef
	for i, s := range a.slots {
		refs[i] = s.live()
	}
	for _, bb := range bufs {
		for i, s := range a.slots {
			if refs[i] == nil {
				continue
			}
			r, bb := refs[i], bb
			if err := a.metaIO(r, func() error { _, err := r.m.WriteAt(bb.buf, bitmapOffset+bb.blk*sbSize); return err }); err != nil {
				a.memberFailed(s, refs[i], "bitmap write", err)
				refs[i] = nil
			}
		}
	}
	ok := false
	for i, s := range a.slots {
		if refs[i] == nil {
			continue
		}
		if err := a.metaIO(refs[i], refs[i].m.Flush); err != nil {
			a.memberFailed(s, refs[i], "bitmap flush", err)
			continue
		}
		if MemberState(s.state.Load()) == MemberInSync {
			ok = true
		}
	}
	if !ok {
		return fmt.Errorf("%w: bitmap could not be written to any in-sync member", ErrIO)
	}
	return nil
}

// hold takes the writer token, as a group commit does, and returns its
// release: while held, no bitmap block is written; bits set meanwhile are
// written by the next writer, to every member live by then.
func (b *bitmap) hold() (release func()) {
	b.mu.Lock()
	b.idle()
	b.writing = true
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.writing = false
		b.cond.Broadcast()
		b.mu.Unlock()
	}
}

// giveBitmap writes the whole image to r, a member just added (live from
// now on), and flushes it. Its own bitmap predates the bits set while it
// was out: were it the only in-sync member at a later assembly, the
// regions written meanwhile would be missing from the bitmap there, and a
// bitmap-based recovery of the other copy would skip them. Caller holds
// the writer token (hold), so no block is written between the image and
// r's start; bits set meanwhile reach r with the next group commit.
func (b *bitmap) giveBitmap(r *memberRef) error {
	a := b.a
	blocks := make(map[int64]bool)
	b.mu.Lock()
	for blk := int64(0); blk < int64(len(b.image))*8/bmBitsPerBlock; blk++ {
		blocks[blk] = true
	}
	bufs := b.marshal(blocks)
	b.mu.Unlock()
	for _, bb := range bufs {
		if err := a.metaIO(r, func() error { _, err := r.m.WriteAt(bb.buf, bitmapOffset+bb.blk*sbSize); return err }); err != nil {
			return err
		}
	}
	return a.metaIO(r, r.m.Flush)
}

// writeAll writes the whole image (Create, Close). Caller holds b.mu.
func (b *bitmap) writeAll() error {
	blocks := make(map[int64]bool)
	for blk := int64(0); blk < int64(len(b.image))*8/bmBitsPerBlock; blk++ {
		blocks[blk] = true
	}
	return b.writeBlocks(blocks)
}

// setAll marks every region dirty in memory (Create without AssumeClean).
func (b *bitmap) setAll() {
	sts := b.states()
	for r := range sts {
		sts[r].Store(bmOnDisk)
		b.image[r/8] |= 1 << (r % 8)
	}
}

// load ORs the on-disk bitmap of r into the image; corrupt or unreadable
// blocks count as all ones. It returns the number of bad blocks. The reads
// are under the deadline (Assemble runs the monitor): a hung member's block
// counts as all ones. Each block is read into a buffer of its own, since an
// abandoned read may still land in it.
func (b *bitmap) load(r *memberRef) int {
	bad := 0
	blocks := int64(len(b.image)) * 8 / bmBitsPerBlock
	for blk := int64(0); blk < blocks; blk++ {
		lo := blk * bmBitsPerBlock / 8
		dst := b.image[lo : lo+bmBitsPerBlock/8]
		var bits []byte
		buf := make([]byte, sbSize)
		err := b.a.metaIO(r, func() error { _, err := r.m.ReadAt(buf, bitmapOffset+blk*sbSize); return err })
		if err == nil {
			bits, err = unmarshalBitmapBlock(buf, uint32(blk))
		}
		if err != nil {
			bad++
			for i := range dst {
				dst[i] = 0xff
			}
			continue
		}
		for i := range dst {
			dst[i] |= bits[i]
		}
	}
	sts := b.states()
	for r := range sts {
		if b.image[r/8]&(1<<(r%8)) != 0 {
			sts[r].Store(bmOnDisk)
		}
	}
	// Bits past the last region stay clear so the image is canonical.
	for r := b.a.geo.regions; r < int64(len(b.image))*8; r++ {
		b.image[r/8] &^= 1 << (r % 8)
	}
	return bad
}

// dirtyRegions returns the regions whose bit is set now.
func (b *bitmap) dirtyRegions() []int64 {
	var rs []int64
	sts := b.states()
	for r := range sts {
		if sts[r].Load()&bmOnDisk != 0 {
			rs = append(rs, int64(r))
		}
	}
	return rs
}

func (b *bitmap) dirtyCount() int64 {
	var n int64
	sts := b.states()
	for r := range sts {
		if sts[r].Load()&bmOnDisk != 0 {
			n++
		}
	}
	return n
}

func (b *bitmap) sweeper() {
	defer b.a.bg.Done()
	t := time.NewTicker(b.a.opts.BitmapClearDelay / 2)
	defer t.Stop()
	for {
		select {
		case <-b.a.stop:
			return
		case <-t.C:
			b.sweep()
		}
	}
}

// sweep clears lazily: a region idle at the previous sweep (candidate) and
// untouched since is cleared after a flush of every member made its data
// durable; idle regions become candidates for the next sweep. Nothing is
// cleared while a slot is not in sync (a returning member needs the bits)
// or a resync is pending.
func (b *bitmap) sweep() {
	a := b.a
	if !a.allInSync() || a.resyncActive.Load() || a.anyBroken() {
		return
	}
	// Candidates are marked with a CAS on the state word alone; no lock.
	var cands []int64
	sts := b.states()
	for r := range sts {
		st := &sts[r]
		if a.regionNeedsResync(int64(r)) {
			continue // its copies may differ: the bit must survive a restart
		}
		switch v := st.Load(); v {
		case bmOnDisk | bmCand:
			cands = append(cands, int64(r))
		case bmOnDisk:
			st.CompareAndSwap(bmOnDisk, bmOnDisk|bmCand)
		}
	}
	if len(cands) == 0 {
		return
	}
	// Every write a candidate saw completed before it was marked (a later
	// one clears the mark); make them durable before any bit goes.
	for _, s := range a.slots {
		if r := s.live(); r != nil {
			if err := a.metaIO(r, r.m.Flush); err != nil {
				a.memberFailed(s, r, "flush", err)
				return
			}
		}
	}
	a.metaMu.Lock()
	if e := a.events.Load(); a.eventsCleared != e {
		a.eventsCleared = e
		a.writeSuperblocksLocked(false, false)
	}
	a.metaMu.Unlock()
	// Take the writer token like a group commit, so that first writes
	// arriving meanwhile wait on the condition, not on the mutex, and no
	// lock is held across the I/O.
	b.mu.Lock()
	b.idle()
	b.writing = true
	sts = b.states() // Array.Grow may have replaced it meanwhile
	blocks := make(map[int64]bool)
	for _, r := range cands {
		if sts[r].CompareAndSwap(bmOnDisk|bmCand, 0) {
			b.image[r/8] &^= 1 << (r % 8)
			blocks[r/bmBitsPerBlock] = true
		}
	}
	bufs := b.marshal(blocks)
	b.mu.Unlock()
	if len(bufs) > 0 {
		if err := b.writeMarshaled(bufs); err != nil {
			klog.ErrorS(err, "raid10: clearing bitmap bits failed")
		}
	}
	b.mu.Lock()
	b.writing = false
	b.cond.Broadcast() // a first write waiting meanwhile becomes the writer
	b.mu.Unlock()
}

// clearAllIfClean clears every bit at Close when the array is in sync and
// no resync is pending (the members were flushed just before).
func (b *bitmap) clearAllIfClean() {
	a := b.a
	if !a.allInSync() || a.resyncPending() || a.anyBroken() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.idle()
	dirty := false
	sts := b.states()
	for r := range sts {
		if sts[r].Swap(0)&bmOnDisk != 0 {
			dirty = true
		}
	}
	if !dirty {
		return
	}
	clear(b.image)
	a.metaMu.Lock()
	a.eventsCleared = a.events.Load()
	a.writeSuperblocksLocked(false, false)
	a.metaMu.Unlock()
	if err := b.writeAll(); err != nil {
		klog.ErrorS(err, "raid10: clearing bitmap at close failed")
	}
}
