package raid10

import (
	"crypto/rand"
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// Create: a new array's geometry and metadata, and the clean-up of a
// create that fails.

func newUUID() [16]byte {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

func roundUp(v, to int64) int64 { return (v + to - 1) / to * to }

// Create writes fresh metadata to every member and returns the running
// array. Members are slots 0..N-1 in order; N >= 2 (odd counts are fine).
// Without opts.AssumeClean the whole array is resynced in the background
// (reads stay correct meanwhile: they use the first copy).
//
// The metadata writes are bounded by the member deadline
// (Options.MemberTimeout): a member that hangs or fails makes Create fail
// with a MemberError naming it (errno EIO), and the superblocks written to
// the members that answered are wiped, so no later Assemble trusts them.
func Create(members []Member, opts CreateOptions) (*Array, error) {
	n := len(members)
	if n < 2 {
		return nil, fmt.Errorf("%w: %d members, need at least 2", ErrTooFewMembers, n)
	}
	if n > MaxMembers {
		return nil, invalidf("%d members, at most %d", n, MaxMembers)
	}
	chunk := opts.ChunkSize
	if chunk == 0 {
		chunk = DefaultChunkSize
	}
	if chunk < BlockSize || chunk&(chunk-1) != 0 || chunk > 1<<30 {
		return nil, invalidf("chunk size %d is not a power of two in [4 KiB, 1 GiB]", chunk)
	}
	region := opts.RegionSize
	if region == 0 {
		region = roundUp(max(DefaultRegionSize, chunk), chunk)
	}
	if region <= 0 || region%chunk != 0 {
		return nil, invalidf("region size %d is not a multiple of the chunk size %d", region, chunk)
	}
	minSize := int64(-1)
	for i, m := range members {
		if m == nil {
			return nil, invalidf("member %d is nil", i)
		}
		if s := m.Size(); minSize < 0 || s < minSize {
			minSize = s
		}
	}
	regionsMax := (minSize*int64(n)/nearCopies + region - 1) / region
	bmBytes := max(1, (regionsMax+bmBitsPerBlock-1)/bmBitsPerBlock) * sbSize
	dataOffset := roundUp(bitmapOffset+bmBytes, dataAlign)
	if minSize < dataOffset+chunk {
		return nil, fmt.Errorf("%w: %d bytes, need at least %d", ErrMemberTooSmall, minSize, dataOffset+chunk)
	}
	devChunks := (minSize - dataOffset) / chunk
	capacity := capacityChunks(n, devChunks) * chunk
	size := capacity
	if opts.Size != 0 {
		if opts.Size < 0 || opts.Size%BlockSize != 0 || opts.Size > capacity {
			return nil, invalidf("size %d: must be a multiple of %d and at most %d", opts.Size, BlockSize, capacity)
		}
		size = opts.Size
	}
	geo := newGeometry(n, chunk, dataOffset, devChunks*chunk, size, region, bmBytes)
	uuid := opts.UUID
	if uuid == ([16]byte{}) {
		uuid = newUUID()
	}
	a := newArray(geo, uuid, opts.Options)
	a.ctime = uint64(time.Now().UnixNano())
	for i, m := range members {
		s := a.slots[i]
		s.ref.Store(newRef(m, newUUID()))
		s.state.Store(int32(MemberInSync))
	}
	if !opts.AssumeClean {
		a.bm.setAll()
		for r := int64(0); r < geo.regions; r++ {
			a.resyncNeed()[r>>6].Or(1 << (r & 63))
		}
		a.resyncActive.Store(true)
	}
	// The metadata writes are under the deadline: a member that hangs is
	// failed by the monitor and Create fails naming it.
	a.startMonitor()
	a.bm.mu.Lock()
	err := a.bm.writeAll()
	a.bm.mu.Unlock()
	if err == nil {
		a.metaMu.Lock()
		a.writeSuperblocksLocked(false, false)
		a.writeSuperblocksLocked(true, false) // both copies valid from the start
		a.metaMu.Unlock()
	}
	if bad := a.createFailed(err); bad != nil {
		return nil, bad
	}
	a.start()
	klog.V(1).InfoS("raid10: created", "members", n, "size", size, "chunk", chunk, "region", region)
	return a, nil
}

// createFailed reports why a Create failed (err, the bitmap write's error,
// or a member that is no longer in sync: a MemberError naming the first
// one, matching EIO), or nil if it did not. On failure it abandons the
// array and wipes both superblock copies of the members that answered, so
// that an assembly of the members fails (no superblock) instead of
// trusting a half-created array. A member that hung gets no wipe: it does
// not answer. Its superblock is normally unwritten (the bitmap, written
// first, or its superblock write hung); one whose superblock landed but
// whose flush hung keeps a superblock of an array holding no data.
func (a *Array) createFailed(err error) error {
	members := make([]Member, len(a.slots))
	hung := make([]bool, len(a.slots))
	var named error
	for i, s := range a.slots {
		r := s.ref.Load()
		members[i], hung[i] = r.m, r.timedOut.Load()
		if named != nil || MemberState(s.state.Load()) == MemberInSync && !s.broken.Load() {
			continue
		}
		cause := fmt.Errorf("%w: a metadata write or flush failed", ErrIO)
		if hung[i] {
			cause = fmt.Errorf("%w: no answer within %v", errTimedOut, a.timeout())
		}
		named = &MemberError{Member: i, Op: "create", Err: cause}
	}
	if named == nil && err == nil {
		return nil
	}
	if named == nil {
		named = err
	}
	klog.ErrorS(named, "raid10: create failed; wiping the superblocks written")
	a.abandonStart()
	wipeSuperblocks(members, hung, a.timeout())
	return named
}

// wipeSuperblocks zeroes both superblock copies of each member not marked
// skip and flushes it, all at once, waiting up to deadline (for ever if it
// is not positive); a member that does not answer in time is logged and
// left (its wipe goes on, from a buffer of its own).
func wipeSuperblocks(members []Member, skip []bool, deadline time.Duration) {
	ch := make(chan struct{}, len(members))
	waiting := 0
	for i, m := range members {
		if m == nil || skip[i] {
			continue
		}
		waiting++
		go func() {
			defer func() { ch <- struct{}{} }()
			_, err := m.WriteAt(AlignedBuffer(2*sbSize), sbCopyA)
			if err == nil {
				err = m.Flush()
			}
			if err != nil {
				klog.ErrorS(err, "raid10: wiping a superblock failed", "member", i)
			}
		}()
	}
	timeout, stop := deadlineTimer(deadline)
	defer stop()
	for ; waiting > 0; waiting-- {
		select {
		case <-ch:
		case <-timeout:
			klog.ErrorS(errTimedOut, "raid10: a superblock wipe did not answer in time", "deadline", deadline)
			return
		}
	}
}
