package raid10

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// A Copy fills a target array with the contents a source array had at one
// instant (the cut): a snapshot, a clone or a restore. See the package
// documentation ("Copies") and docs/on-disk-format.md for the record.
//
// The source's address space is cut into regions (a power of two, whole
// chunks of both arrays); the copy record at the target's reserved tail
// holds one bit per region, set once the region's data as of the cut is
// durable on the target. The invariant, for every region: either its bit is
// set and the target holds the region as of the cut, or the source region
// is unchanged since the cut. Two hooks keep it:
//
//   - on a live source (Live), every write, discard or write-zeroes piece
//     into a region whose bit is clear first copies that region (copy
//     before write);
//   - on the target, every read or write piece of a region whose bit is
//     clear first copies that region (hydrate on access), so a cloned
//     volume serves its data at once and a write into it is never
//     overwritten by the copier.
//
// A background copier copies the other regions at the rebuild rate. When
// every bit is set the record says ready, the hooks go, and the target is
// an independent thick copy.
//
// This file holds the copy's API (NewCopy, ResumeCopy, Stop, Wait, ...);
// copy_hooks.go the hooks, copier.go the background copier, copy_record.go
// the record.

// copyRegionMin is the smallest region copyRegionSize picks: what the first
// write into an uncopied region copies before it proceeds (tests lower it).
var copyRegionMin int64 = 16 << 10

// copyBatch is how much the background copier copies per flush and bitmap
// write: consecutive uncopied regions, up to this many bytes (tests lower
// it).
var copyBatch int64 = 4 << 20

// ErrCopyStale is returned by ResumeCopy for a live copy whose source was
// served without its hook since (its target was absent when the source was
// assembled and the source's copy generation moved on): the target does not
// hold the cut.
var ErrCopyStale = errors.New("raid10: copy record stale: its source was served without the copy's hook")

// ErrNoCopyRecord is returned when the target's reserved tail holds no copy record.
var ErrNoCopyRecord = errors.New("raid10: no copy record")

// ErrCopyFailed is returned by target I/O into a region a failed copy did
// not fill, and by Copy.Wait. It wraps syscall.EIO.
var ErrCopyFailed = &wrapped{msg: "raid10: copy failed", errno: ErrIO.errno}

// CopyConfig describes a new copy, or the arrays of one to resume.
type CopyConfig struct {
	// Source is read; Target written. Target must have reserved
	// CopyRecordSize bytes (Reserve) and be at least Size bytes.
	Source, Target *Array
	// Size is the number of bytes from offset 0 to copy (NewCopy only).
	Size int64
	// Live cuts a served source: its writes are held for an instant while
	// the copy-before-write hook goes in (NewCopy only). Without it the
	// caller promises that nothing writes the source while the copy runs
	// (a snapshot being restored).
	Live bool
	// CutAt is the time recorded as the cut (NewCopy; zero: now).
	CutAt time.Time
	// OnFail, when set, is called (on its own goroutine) once the copy
	// fails; writers into uncopied source regions wait until it returns, so
	// it can record the failure durably (the target does not hold the cut).
	OnFail func(err error)
	// OnReady, when set, is called once the record says ready.
	OnReady func()
	// SourceName is recorded as CopyRecord.SourceName (NewCopy only).
	SourceName string
}

// Copy is a running (or finished) copy; see the comment at the top of
// copy.go.
type Copy struct {
	cfg    CopyConfig
	src    *Array
	tgt    *Array
	rec    CopyRecord
	recOff int64
	shift  uint
	bits   []atomic.Uint64 // durable copied bits, one per region

	mu    sync.Mutex              // busy
	busy  map[int64]chan struct{} // regions being copied now
	batch []byte                  // the copier's buffer

	pendMu  sync.Mutex // pend, leading: the group commit
	pend    []bitReq
	leading bool

	recMu    sync.Mutex // the record image and its block sequence numbers
	image    []byte     // bitmap bytes, crBitsPerBlock bits per block
	blockSeq []uint64

	copied   atomic.Int64 // bytes copied
	state    atomic.Uint32
	failErr  error
	failOnce sync.Once
	failDone chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{} // closed when the copier ends
	ready    chan struct{} // closed when the record says ready
	started  atomic.Bool
	counted  atomic.Bool // a live copy counted in its source's superblocks

	// Pause is how long the source's writes were held at the cut.
	Pause time.Duration
}

// copyRegionSize picks the region: a power of two, at least copyRegionMin,
// and few enough regions for the record. It does not depend on the arrays'
// chunks (a piece may span several regions).
func copyRegionSize(size int64) int64 {
	r := copyRegionMin
	for (size+r-1)/r > crMaxRegions {
		r <<= 1
	}
	return r
}

// NewCopy starts a copy of cfg.Size bytes of cfg.Source into cfg.Target:
// it writes a fresh record (state running, every bit clear) into the
// target's reserved tail and flushes it, then (Live) holds the source's
// writes while the copy-before-write hook goes in, and installs the
// hydrate hook on the target. It returns once the cut is durable; Start
// runs the background copier.
func NewCopy(cfg CopyConfig) (*Copy, error) {
	src, tgt := cfg.Source, cfg.Target
	switch {
	case src == nil || tgt == nil || src == tgt:
		return nil, invalidf("copy: source and target must be two arrays")
	case tgt.reserved.Load() < CopyRecordSize:
		return nil, invalidf("copy: the target reserves %d bytes for the record, %d needed", tgt.reserved.Load(), CopyRecordSize)
	case cfg.Size <= 0 || cfg.Size%BlockSize != 0 || cfg.Size > src.Size() || cfg.Size > tgt.Size():
		return nil, invalidf("copy: %d bytes from a %d-byte source into a %d-byte target", cfg.Size, src.Size(), tgt.Size())
	}
	if cfg.CutAt.IsZero() {
		cfg.CutAt = time.Now()
	}
	if len(cfg.SourceName) >= crNameMax {
		return nil, invalidf("copy: source name of %d bytes (at most %d)", len(cfg.SourceName), crNameMax-1)
	}
	region := copyRegionSize(cfg.Size)
	rec := CopyRecord{State: CopyRunning, Live: cfg.Live, Source: src.uuid, Target: tgt.uuid,
		Size: cfg.Size, RegionSize: region, Regions: (cfg.Size + region - 1) / region, CutAt: cfg.CutAt,
		SourceName: cfg.SourceName}
	if cfg.Live {
		// Counted in the source's superblocks before the record exists: a
		// crash in between only makes the next assembly bump the generation.
		src.metaMu.Lock()
		src.liveCopies++
		src.writeSuperblocksLocked(true, false)
		rec.SrcGen = src.copyGen
		failed := src.stateLocked() == ArrayFailed
		src.metaMu.Unlock()
		if failed {
			return nil, fmt.Errorf("%w: copy: the source's superblocks could not be written", ErrIO)
		}
	}
	c := newCopy(cfg, rec)
	c.counted.Store(cfg.Live)
	// The whole record area: header slot A, empty slot B, every bitmap
	// block's slot A with seq 0 and no bit, slot B empty.
	area := AlignedBuffer(CopyRecordSize)
	copy(area, c.encodeHeader(1))
	for blk := range int64(len(c.blockSeq)) {
		copy(area[2*crSlot+blk*2*crSlot:], c.encodeBlock(blk, 0))
	}
	if _, err := tgt.write(opWrite, area, c.recOff, CopyRecordSize, true, true); err != nil {
		return nil, fmt.Errorf("copy: write the record: %w", err)
	}
	c.rec.seq = 1
	if err := tgt.Flush(); err != nil {
		return nil, fmt.Errorf("copy: flush the record: %w", err)
	}
	c.install()
	if cfg.Live {
		// A copy from the source that failed unrecorded between the count and the install
		// moved the generation on (void) without seeing this copy's hook.
		src.metaMu.Lock()
		gen := src.copyGen
		src.metaMu.Unlock()
		if err := c.followGen(gen); err != nil {
			klog.ErrorS(err, "raid10: copy record not moved to the source's new copy generation (it is refused at the next assembly)", "target", fmt.Sprintf("%x", rec.Target))
		}
	}
	return c, nil
}

// ResumeCopy reads the record of cfg.Target and, if its copy is running,
// installs the hooks again (before the caller serves either array) with
// the bits the record holds; Start resumes the copier. A ready or failed
// record gives a Copy in that state with no hooks.
func ResumeCopy(cfg CopyConfig) (*Copy, error) {
	rec, err := ReadCopyRecord(cfg.Target)
	if err != nil {
		return nil, err
	}
	c := newCopy(cfg, rec)
	c.state.Store(uint32(rec.State))
	if rec.State != CopyRunning {
		if rec.State == CopyReady {
			c.copied.Store(rec.Size)
			close(c.ready)
		}
		close(c.done)
		return c, nil
	}
	if cfg.Source == nil || cfg.Source.uuid != rec.Source || cfg.Target.uuid != rec.Target ||
		rec.Size > cfg.Source.Size() || rec.Size > cfg.Target.Size() || rec.RegionSize < minCopyRegion {
		return nil, fmt.Errorf("%w: copy record of %d bytes in regions of %d, from %x into %x, does not fit the arrays given", ErrInvalid, rec.Size, rec.RegionSize, rec.Source, rec.Target)
	}
	// The bitmap blocks: the valid slot with the higher seq of each.
	n := int64(len(c.blockSeq))
	b := AlignedBuffer(int(2 * crSlot * n))
	if _, err := c.tgt.read(b, c.recOff+2*crSlot, true); err != nil {
		return nil, fmt.Errorf("copy: read the record bitmap: %w", err)
	}
	for blk := range n {
		var got []byte
		var seq uint64
		for k := range int64(2) {
			s := b[(2*blk+k)*crSlot : (2*blk+k+1)*crSlot]
			if q, bits, ok := decodeBlock(s, blk); ok && (got == nil || q > seq) {
				got, seq = bits, q
			}
		}
		if got == nil {
			return nil, fmt.Errorf("%w: copy record bitmap block %d: both copies fail their checks", ErrCorruptBitmap, blk)
		}
		c.blockSeq[blk] = seq
		copy(c.image[blk*crBitsPerBlock/8:], got)
	}
	for r := range rec.Regions {
		if c.image[r/8]&(1<<(r%8)) != 0 {
			c.bits[r>>6].Or(1 << (r & 63))
			c.copied.Add(min(rec.RegionSize, rec.Size-r<<c.shift))
		}
	}
	if rec.Live {
		src := cfg.Source
		src.metaMu.Lock()
		stale := rec.SrcGen != src.copyGen
		if !stale {
			src.resumedCopies++
			src.resumed = append(src.resumed, c)
		}
		src.metaMu.Unlock()
		if stale {
			return nil, fmt.Errorf("%w (record generation %d, source %d)", ErrCopyStale, rec.SrcGen, src.copyGen)
		}
		c.counted.Store(true)
	}
	c.install()
	return c, nil
}

func newCopy(cfg CopyConfig, rec CopyRecord) *Copy {
	c := &Copy{cfg: cfg, src: cfg.Source, tgt: cfg.Target, rec: rec, recOff: cfg.Target.Size(),
		busy: map[int64]chan struct{}{}, failDone: make(chan struct{}), stop: make(chan struct{}),
		done: make(chan struct{}), ready: make(chan struct{})}
	for int64(1)<<c.shift < max(rec.RegionSize, 1) {
		c.shift++
	}
	c.bits = make([]atomic.Uint64, (rec.Regions+63)/64)
	blocks := max((rec.Regions+crBitsPerBlock-1)/crBitsPerBlock, 1)
	c.image = make([]byte, blocks*crBitsPerBlock/8)
	c.blockSeq = make([]uint64, blocks)
	c.state.Store(uint32(CopyRunning))
	c.batch = AlignedBuffer(int(max(rec.RegionSize, copyBatch)))
	return c
}

// fail ends a copy that cannot go on: the hooks stop copying, OnFail
// records it, and source writers waiting on the copy go on after that.
func (c *Copy) fail(err error) {
	c.failOnce.Do(func() {
		c.failErr = err
		c.state.Store(uint32(CopyFailed))
		klog.ErrorS(err, "raid10: copy failed: the target does not hold the source's data", "source", fmt.Sprintf("%x", c.rec.Source), "target", fmt.Sprintf("%x", c.rec.Target))
		go func() {
			if werr := c.writeState(CopyFailed); werr != nil {
				// The record may still say running: void it before the hook goes.
				klog.ErrorS(werr, "raid10: copy failure not recorded in the target's record: the source's copy generation moves on", "target", fmt.Sprintf("%x", c.rec.Target))
				c.void()
			}
			if c.cfg.OnFail != nil {
				c.cfg.OnFail(err)
			}
			c.uninstall(false)
			c.ended()
			close(c.failDone)
		}()
	})
}

// Stop ends the copier and removes the hooks (the target is being deleted,
// or its arrays closed); the record keeps its state, so ResumeCopy
// continues from the bits it holds. It waits for the copier.
func (c *Copy) Stop() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.uninstall(true)
	if c.started.Load() || CopyState(c.state.Load()) != CopyRunning {
		<-c.done
	}
}

// Cancel is Stop for a copy whose target is being deleted (the caller has
// recorded that durably first): the source no longer counts it among its
// running copies.
func (c *Copy) Cancel() {
	c.Stop()
	if CopyState(c.state.Load()) == CopyRunning {
		c.ended()
	}
}

// ended takes a finished, failed or cancelled live copy off its source's
// count of running copies (once).
func (c *Copy) ended() {
	if !c.rec.Live || !c.counted.CompareAndSwap(true, false) {
		return
	}
	a := c.src
	if a.closed.Load() {
		return
	}
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	if a.liveCopies > 0 {
		a.liveCopies--
		a.writeSuperblocksLocked(true, false)
	}
}

// void is ended for a live copy that failed without its target's record saying so (the
// record write failed: it may still say running, with the source's generation). Before
// the hook goes and a write into an uncopied region goes on without it, the source's copy
// generation moves on in its superblocks, so that record is refused (ErrCopyStale) if the
// target comes back; the other running live copies from the source take the new
// generation into their records (followGen). A closed source takes no more writes: its
// uncopied regions still hold the cut, and the record may resume.
func (c *Copy) void() {
	if !c.rec.Live || !c.counted.CompareAndSwap(true, false) {
		return
	}
	a := c.src
	if a.closed.Load() {
		return
	}
	a.metaMu.Lock()
	if a.liveCopies > 0 {
		a.liveCopies--
	}
	a.copyGen++
	gen := a.copyGen
	a.writeSuperblocksLocked(true, false)
	a.metaMu.Unlock()
	if h := a.hooks.Load(); h != nil {
		for _, o := range h.cow {
			if o == c {
				continue
			}
			if err := o.followGen(gen); err != nil {
				klog.ErrorS(err, "raid10: copy record not moved to the source's new copy generation (it is refused at the next assembly)", "target", fmt.Sprintf("%x", o.rec.Target))
			}
		}
	}
}

// followGen writes the source's copy generation gen into the header of a running live
// copy's record (its state unchanged), unless it holds gen or a later one already.
func (c *Copy) followGen(gen uint32) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	if CopyState(c.state.Load()) != CopyRunning || c.rec.SrcGen >= gen {
		return nil
	}
	c.rec.SrcGen = gen
	return c.writeHeaderLocked()
}

// CopiesResumed is called by the owner of a source array after ResumeCopy
// of every copy it found, before it serves the array. If the source's
// superblocks count more running live copies than were resumed, some copy
// target is absent: the array is about to be served without that copy's
// hook, so the copy generation is bumped (in the superblocks, then in the
// records of the resumed copies) and the absent copy's record, carrying
// the old generation, is refused by ResumeCopy if it ever comes back
// (ErrCopyStale).
func (a *Array) CopiesResumed() error {
	a.metaMu.Lock()
	if a.liveCopies <= a.resumedCopies {
		a.metaMu.Unlock()
		return nil
	}
	klog.InfoS("raid10: running copies from this array are missing: their records are void from now on",
		"running", a.liveCopies, "resumed", a.resumedCopies, "copyGeneration", a.copyGen+1)
	a.copyGen++
	a.liveCopies = a.resumedCopies
	gen := a.copyGen
	a.writeSuperblocksLocked(true, false)
	failed := a.stateLocked() == ArrayFailed
	resumed := a.resumed
	a.metaMu.Unlock()
	if failed {
		return fmt.Errorf("%w: the copy generation could not be recorded", ErrIO)
	}
	var first error
	for _, c := range resumed {
		if err := c.followGen(gen); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Wait returns nil once the copy is ready, ErrCopyFailed if it failed,
// ctx's error, or ErrClosed if it was stopped.
func (c *Copy) Wait(ctx context.Context) error {
	select {
	case <-c.ready:
		return nil
	case <-c.failDone:
		return fmt.Errorf("%w: %w", ErrCopyFailed, c.failErr)
	case <-c.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Record is the copy's header as last written (State is the live state).
func (c *Copy) Record() CopyRecord {
	c.recMu.Lock()
	r := c.rec
	c.recMu.Unlock()
	r.State = CopyState(c.state.Load())
	return r
}

// Copied is the number of bytes copied so far.
func (c *Copy) Copied() int64 { return c.copied.Load() }

// Err is why the copy failed, nil otherwise.
func (c *Copy) Err() error {
	if CopyState(c.state.Load()) == CopyFailed {
		return c.failErr
	}
	return nil
}
