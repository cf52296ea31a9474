package raid10

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
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

// CopyRecordSize is the number of bytes a copy target reserves at the end of
// its array for the copy record (Array.Reserve).
const CopyRecordSize = 1 << 20

// Copy record layout constants.
const (
	crMagic        = "R10COPY\x00"
	crBlockMagic   = "R10C"
	crVersion      = 1
	crSlot         = 4096
	crBitsOffset   = 16
	crBitsPerBlock = (crSlot - 4 - crBitsOffset) * 8 // 32608
	crMaxBlocks    = (CopyRecordSize - 2*crSlot) / (2 * crSlot)
	crMaxRegions   = crMaxBlocks * crBitsPerBlock
	minCopyRegion  = 4096
	crFlagLive     = 1
	crNameMax      = 64 // source name field, NUL-padded
)

// copyRegionMin is the smallest region copyRegionSize picks: what the first
// write into an uncopied region copies before it proceeds (tests lower it).
var copyRegionMin int64 = 16 << 10

// copyBatch is how much the background copier copies per flush and bitmap
// write: consecutive uncopied regions, up to this many bytes (tests lower
// it).
var copyBatch int64 = 4 << 20

// CopyState is the state a copy record holds.
type CopyState uint32

// Copy states.
const (
	// CopyRunning: regions whose bit is clear still need copying; the hooks
	// must be in place before the source or target serves any I/O.
	CopyRunning CopyState = 1
	// CopyReady: every region was copied; the target is independent.
	CopyReady CopyState = 2
	// CopyFailed: the copy could not go on (the target could not be
	// written); the target does not hold the source's data.
	CopyFailed CopyState = 3
)

func (s CopyState) String() string {
	switch s {
	case CopyRunning:
		return "running"
	case CopyReady:
		return "ready"
	case CopyFailed:
		return "failed"
	}
	return fmt.Sprintf("state-%d", uint32(s))
}

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

// CopyRecord is the decoded header of a copy record.
type CopyRecord struct {
	State      CopyState
	Live       bool     // the source was cut while served (copy-before-write hook)
	Source     [16]byte // source array UUID
	Target     [16]byte // target array UUID
	Size       int64    // bytes copied from offset 0 of the source
	RegionSize int64
	Regions    int64
	CutAt      time.Time
	// SourceName is the caller's name of the source at the cut (at most 63
	// bytes; the pool's volume or snapshot name), kept for its reports.
	SourceName string
	// SrcGen is the source's copy generation the record is valid for
	// (Live copies; see Array.CopiesResumed).
	SrcGen uint32
	seq    uint64
}

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
	return c, nil
}

// ReadCopyRecord reads the copy record at the reserved tail of tgt.
func ReadCopyRecord(tgt *Array) (CopyRecord, error) {
	off := tgt.Size()
	if tgt.reserved.Load() < CopyRecordSize {
		return CopyRecord{}, invalidf("copy: the array reserves no copy record")
	}
	b := AlignedBuffer(2 * crSlot)
	if _, err := tgt.read(b, off, true); err != nil {
		return CopyRecord{}, fmt.Errorf("copy: read the record header: %w", err)
	}
	var best *CopyRecord
	magic := false
	for k := range 2 {
		s := b[k*crSlot : (k+1)*crSlot]
		if string(s[:8]) == crMagic {
			magic = true
		}
		r, ok := decodeHeader(s)
		if ok && (best == nil || r.seq > best.seq) {
			best = &r
		}
	}
	switch {
	case best != nil:
		return *best, nil
	case magic:
		return CopyRecord{}, fmt.Errorf("%w: copy record header: both copies fail their checks", ErrCorruptBitmap)
	}
	return CopyRecord{}, ErrNoCopyRecord
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

// hookSet is what an array's copy hooks are: at most one copy into it,
// any number out of it. It is replaced whole (copy on write).
type hookSet struct {
	hydrate *Copy
	cow     []*Copy
}

func (a *Array) updateHooks(f func(h *hookSet)) {
	a.hookMu.Lock()
	defer a.hookMu.Unlock()
	var h hookSet
	if old := a.hooks.Load(); old != nil {
		h.hydrate = old.hydrate
		h.cow = append([]*Copy(nil), old.cow...)
	}
	f(&h)
	if h.hydrate == nil && len(h.cow) == 0 {
		a.hooks.Store(nil)
		return
	}
	a.hooks.Store(&h)
}

// pendingCopy returns a copy and a region of it that must be copied before
// a write piece of [aoff, aoff+n) proceeds, or nil. One atomic load without
// hooks; with hooks, one bit test per region the piece touches.
func (a *Array) pendingCopy(aoff, n int64) (c *Copy, r int64, target bool) {
	h := a.hooks.Load()
	if h == nil {
		return nil, 0, false
	}
	return h.pending(aoff, n)
}

func (h *hookSet) pending(aoff, n int64) (c *Copy, r int64, target bool) {
	if c := h.hydrate; c != nil {
		if r, ok := c.missing(aoff, n); ok {
			return c, r, true
		}
	}
	for _, c := range h.cow {
		if r, ok := c.missing(aoff, n); ok {
			return c, r, false
		}
	}
	return nil, 0, false
}

// pendingHydrate is pendingCopy for a read piece: only the copy into the
// array counts.
func (a *Array) pendingHydrate(aoff, n int64) (*Copy, int64) {
	h := a.hooks.Load()
	if h == nil || h.hydrate == nil {
		return nil, 0
	}
	if r, ok := h.hydrate.missing(aoff, n); ok {
		return h.hydrate, r
	}
	return nil, 0
}

// hydrateRange copies every uncopied region of [off, off+n) of a copy
// target before a read of it.
func (a *Array) hydrateRange(off, n int64) error {
	for {
		c, r := a.pendingHydrate(off, n)
		if c == nil {
			return nil
		}
		if err := c.ensure(r, (off+n-1)>>c.shift, true); err != nil {
			return err
		}
	}
}

// install puts the hooks in: on a live source with every bucket drained,
// so every write piece admitted afterwards sees the hook and none
// admitted before is still running (the cut).
func (c *Copy) install() {
	c.tgt.updateHooks(func(h *hookSet) { h.hydrate = c })
	if !c.rec.Live {
		return
	}
	t0 := time.Now()
	c.src.freeze()
	c.src.updateHooks(func(h *hookSet) { h.cow = append(h.cow, c) })
	c.src.thaw()
	c.Pause = time.Since(t0)
}

// uninstall removes the hooks; pieces that loaded them before find the
// copy no longer running, or every bit set.
func (c *Copy) uninstall(target bool) {
	if c.rec.Live {
		c.src.updateHooks(func(h *hookSet) {
			out := h.cow[:0]
			for _, x := range h.cow {
				if x != c {
					out = append(out, x)
				}
			}
			h.cow = out
		})
	}
	if target {
		c.tgt.updateHooks(func(h *hookSet) {
			if h.hydrate == c {
				h.hydrate = nil
			}
		})
	}
}

// has reports whether region r needs no copy: its bit is set, or it lies
// beyond the copy.
func (c *Copy) has(r int64) bool {
	return r >= c.rec.Regions || c.bits[r>>6].Load()&(1<<(r&63)) != 0
}

// missing returns the first region of [aoff, aoff+n) that still needs a copy.
func (c *Copy) missing(aoff, n int64) (int64, bool) {
	for r := aoff >> c.shift; r <= (aoff+n-1)>>c.shift; r++ {
		if !c.has(r) {
			return r, true
		}
	}
	return 0, false
}

// ensure copies the region of aoff unless it is copied already; concurrent
// callers for one region wait for the one copy. A copy that failed (or was
// stopped) lets source writes go on once the failure is recorded
// (OnFail), and fails target I/O with ErrCopyFailed.
func (c *Copy) ensure(r, last int64, target bool) error {
	for {
		c.mu.Lock()
		if c.has(r) {
			c.mu.Unlock()
			return nil
		}
		if CopyState(c.state.Load()) != CopyRunning || c.stopped() {
			c.mu.Unlock()
			return c.hookErr(target)
		}
		if ch, ok := c.busy[r]; ok {
			c.mu.Unlock()
			<-ch
			continue
		}
		c.mu.Unlock()
		// This region and the uncopied ones after it up to the piece's last,
		// in one copy.
		k, ch := c.claim(r, last-r+1)
		if k == 0 {
			continue
		}
		bp := getBounce(int(k << c.shift))
		err := c.copyRegions(r, k, *bp)
		putBounce(bp)
		c.release(r, k, ch)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				// An array closed under the copy (Close without Stop): not a
				// failure of the copy; the record resumes it.
				return ErrClosed
			}
			c.fail(err)
			return c.hookErr(target)
		}
		return nil
	}
}

// hookErr is what I/O that met a copy no longer running gets: a source
// write goes on once the failure is recorded; target I/O fails.
func (c *Copy) hookErr(target bool) error {
	if CopyState(c.state.Load()) == CopyFailed {
		select {
		case <-c.failDone:
		case <-c.stop:
		}
	}
	if !target {
		return nil
	}
	if c.stopped() && CopyState(c.state.Load()) == CopyRunning {
		return ErrClosed
	}
	return fmt.Errorf("%w: the region was not copied from the source", ErrCopyFailed)
}

func (c *Copy) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// copyRegions copies regions [r, r+k) (as the source reads now, which is
// the cut: their bits are clear, and the caller holds them busy) into the
// target, makes them durable and durably sets their bits. Blocks the source
// cannot deliver are recorded bad on every copy of the target (reads of
// them fail there as on the source), never zero.
func (c *Copy) copyRegions(r, k int64, b []byte) error {
	off := r << c.shift
	n := min(k<<c.shift, c.rec.Size-off)
	buf := b[:n]
	var lost []badRange
	if _, err := c.src.ReadAt(buf, off); err != nil {
		if errors.Is(err, ErrClosed) {
			return err
		}
		// Block by block: a block no copy of the source has is lost.
		for b := int64(0); b < n; b += BlockSize {
			p := buf[b : b+BlockSize]
			if _, err := c.src.ReadAt(p, off+b); err != nil {
				if errors.Is(err, ErrClosed) {
					return err
				}
				clear(p)
				lost = addRun(lost, (off+b)/BlockSize, 1)
			}
		}
		klog.ErrorS(nil, "raid10: copy: source blocks unreadable, recorded lost on the target", "region", r, "regions", k, "runs", len(lost))
	}
	if _, err := c.tgt.write(opWrite, buf, off, n, false, true); err != nil {
		if errors.Is(err, ErrClosed) {
			return err
		}
		return fmt.Errorf("copy: write region %d to the target: %w", r, err)
	}
	for _, l := range lost {
		if err := c.tgt.markLost(l.start*BlockSize, l.count*BlockSize); err != nil {
			return fmt.Errorf("copy: region %d: %w", r, err)
		}
	}
	return c.commit(r, k, n)
}

// bitReq is a copy waiting for its bits to be recorded.
type bitReq struct {
	r, k, n int64
	done    chan error
}

// commit makes the data of regions [r, r+k) durable and records their bits,
// batched with the copies that wait at the same time (group commit): one
// leader flushes the target once for all of them (their data writes
// completed before they queued), then writes each bitmap block they touch
// once.
func (c *Copy) commit(r, k, n int64) error {
	req := bitReq{r: r, k: k, n: n, done: make(chan error, 1)}
	c.pendMu.Lock()
	c.pend = append(c.pend, req)
	if c.leading {
		c.pendMu.Unlock()
		return <-req.done
	}
	c.leading = true
	c.pendMu.Unlock()
	for {
		c.pendMu.Lock()
		batch := c.pend
		c.pend = nil
		if len(batch) == 0 {
			c.leading = false
			c.pendMu.Unlock()
			break
		}
		c.pendMu.Unlock()
		err := c.tgt.Flush()
		if err != nil {
			err = fmt.Errorf("copy: flush the target: %w", err)
		} else {
			err = c.persistBits(batch)
		}
		for _, b := range batch {
			b.done <- err
		}
	}
	return <-req.done
}

// persistBits durably sets the bits of the batch's regions (their data is
// durable): each bitmap block holding some is written into the slot its
// last write did not use, with FUA. A torn write leaves the other slot,
// which lacks only bits whose regions no write has touched yet.
func (c *Copy) persistBits(batch []bitReq) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	blocks := map[int64]bool{}
	for _, q := range batch {
		for x := q.r; x < q.r+q.k; x++ {
			c.image[x/8] |= 1 << (x % 8)
			blocks[x/crBitsPerBlock] = true
		}
	}
	for blk := range blocks {
		seq := c.blockSeq[blk] + 1
		b := c.encodeBlock(blk, seq)
		if _, err := c.tgt.write(opWrite, b, c.recOff+2*crSlot+(2*blk+int64(seq%2))*crSlot, crSlot, true, true); err != nil {
			for _, q := range batch {
				for x := q.r; x < q.r+q.k; x++ {
					if !c.has(x) {
						c.image[x/8] &^= 1 << (x % 8)
					}
				}
			}
			return fmt.Errorf("copy: record the copied regions in bitmap block %d: %w", blk, err)
		}
		c.blockSeq[blk] = seq
	}
	for _, q := range batch {
		for x := q.r; x < q.r+q.k; x++ {
			c.bits[x>>6].Or(1 << (x & 63))
		}
		c.copied.Add(q.n)
	}
	return nil
}

// claim marks up to most consecutive uncopied regions from r busy for the
// copier and returns how many; 0 if region r is copied or busy.
func (c *Copy) claim(r, most int64) (int64, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	k := int64(0)
	for ; k < most && r+k < c.rec.Regions && !c.has(r+k); k++ {
		if _, busy := c.busy[r+k]; busy {
			break
		}
		c.busy[r+k] = ch
	}
	return k, ch
}

func (c *Copy) release(r, k int64, ch chan struct{}) {
	c.mu.Lock()
	for x := r; x < r+k; x++ {
		delete(c.busy, x)
	}
	close(ch)
	c.mu.Unlock()
}

// writeState writes the header with state st into the slot not holding the
// current one, with FUA.
func (c *Copy) writeState(st CopyState) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	c.rec.State = st
	seq := c.rec.seq + 1
	b := c.encodeHeader(seq)
	if _, err := c.tgt.write(opWrite, b, c.recOff+int64(seq%2)*crSlot, crSlot, true, true); err != nil {
		return err
	}
	c.rec.seq = seq
	return nil
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
				klog.V(1).InfoS("raid10: copy failure not recorded in the target's record", "err", werr)
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

// Start runs the background copier (once).
func (c *Copy) Start() {
	if !c.started.CompareAndSwap(false, true) {
		return
	}
	if CopyState(c.state.Load()) != CopyRunning {
		return
	}
	go c.run()
}

func (c *Copy) run() {
	defer close(c.done)
	start, base := time.Now(), c.copied.Load()
	lastFg := c.src.fgWrites()
	most := int64(len(c.batch)) >> c.shift
	for r := int64(0); r < c.rec.Regions; {
		if c.stopped() || CopyState(c.state.Load()) != CopyRunning {
			return
		}
		if c.has(r) {
			r++
			continue
		}
		k, ch := c.claim(r, most)
		if k == 0 {
			// A foreground write copies it now: wait for that.
			if err := c.ensure(r, r, true); err != nil {
				return
			}
			r++
			continue
		}
		err := c.copyRegions(r, k, c.batch)
		c.release(r, k, ch)
		if err != nil {
			if !errors.Is(err, ErrClosed) {
				c.fail(err)
			}
			return
		}
		r += k
		// The rebuild's rate settings (the target's Options): at most
		// SyncRateMax, falling back towards SyncRateMin while the source
		// takes writes (its own reads of the source do not count).
		done := c.copied.Load() - base
		el := time.Since(start)
		rate := float64(done) / max(el.Seconds(), 1e-6)
		o := c.tgt.opts
		if o.SyncRateMax > 0 && rate > float64(o.SyncRateMax) {
			c.sleep(min(time.Duration(float64(done)/float64(o.SyncRateMax)*float64(time.Second))-el, 200*time.Millisecond))
		} else if fg := c.src.fgWrites(); fg != lastFg {
			lastFg = fg
			if o.SyncRateMin > 0 && rate > float64(o.SyncRateMin) {
				c.sleep(min(time.Duration(float64(done)/float64(o.SyncRateMin)*float64(time.Second))-el, 10*time.Millisecond))
			}
		}
	}
	if c.stopped() || CopyState(c.state.Load()) != CopyRunning {
		return
	}
	if err := c.writeState(CopyReady); err != nil {
		c.fail(fmt.Errorf("copy: record ready: %w", err))
		return
	}
	c.state.Store(uint32(CopyReady))
	c.uninstall(true)
	c.ended()
	close(c.ready)
	klog.InfoS("raid10: copy ready", "source", fmt.Sprintf("%x", c.rec.Source), "target", fmt.Sprintf("%x", c.rec.Target), "bytes", c.rec.Size)
	if c.cfg.OnReady != nil {
		c.cfg.OnReady()
	}
}

// fgWrites counts the array's write pieces: the copier's yield signal (its
// own reads of the source would make fgOps move every time).
func (a *Array) fgWrites() uint64 {
	var n uint64
	for i := range a.buckets {
		n += a.buckets[i].wOps.Load()
	}
	return n
}

func (c *Copy) sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.stop:
	}
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
		c.recMu.Lock()
		c.rec.SrcGen = gen
		c.recMu.Unlock()
		if err := c.writeState(CopyRunning); err != nil && first == nil {
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

// markLost records array bytes [off, off+length) bad on every live copy:
// reads there fail with EIO until a write puts data there. It fails if a
// live copy could not record them.
func (a *Array) markLost(off, length int64) error {
	for length > 0 {
		c := off >> a.geo.chunkShift
		within := off & (a.geo.chunk - 1)
		n := min(length, a.geo.chunk-within)
		d0, d1, o0, o1 := a.geo.mapChunk(c)
		for _, x := range [2]struct {
			s *slot
			o int64
		}{{a.slots[d0], o0 + within}, {a.slots[d1], o1 + within}} {
			if r := x.s.live(); r != nil && !a.recordBad(x.s, r, x.o, n) {
				return fmt.Errorf("%w: blocks at %d could not be recorded bad on member %d", ErrIO, off, x.s.idx)
			}
		}
		off += n
		length -= n
	}
	return nil
}

// Record encoding; see docs/on-disk-format.md ("Copy record").

func (c *Copy) encodeHeader(seq uint64) []byte {
	b := AlignedBuffer(crSlot)
	le := binary.LittleEndian
	copy(b, crMagic)
	le.PutUint32(b[8:], crVersion)
	le.PutUint32(b[12:], uint32(c.rec.State))
	var fl uint32
	if c.rec.Live {
		fl |= crFlagLive
	}
	le.PutUint32(b[16:], fl)
	le.PutUint64(b[24:], seq)
	copy(b[32:], c.rec.Source[:])
	copy(b[48:], c.rec.Target[:])
	le.PutUint64(b[64:], uint64(c.rec.Size))
	le.PutUint64(b[72:], uint64(c.rec.RegionSize))
	le.PutUint64(b[80:], uint64(c.rec.Regions))
	le.PutUint64(b[88:], uint64(c.rec.CutAt.UnixNano()))
	copy(b[96:96+crNameMax], c.rec.SourceName)
	le.PutUint32(b[96+crNameMax:], c.rec.SrcGen)
	le.PutUint32(b[crSlot-4:], crc32.Checksum(b[:crSlot-4], castagnoli))
	return b
}

func decodeHeader(b []byte) (CopyRecord, bool) {
	le := binary.LittleEndian
	if string(b[:8]) != crMagic || le.Uint32(b[crSlot-4:]) != crc32.Checksum(b[:crSlot-4], castagnoli) ||
		le.Uint32(b[8:]) != crVersion {
		return CopyRecord{}, false
	}
	r := CopyRecord{State: CopyState(le.Uint32(b[12:])), seq: le.Uint64(b[24:]),
		Size: int64(le.Uint64(b[64:])), RegionSize: int64(le.Uint64(b[72:])), Regions: int64(le.Uint64(b[80:])),
		CutAt: time.Unix(0, int64(le.Uint64(b[88:]))).UTC()}
	r.SourceName = string(bytes.TrimRight(b[96:96+crNameMax], "\x00"))
	r.SrcGen = le.Uint32(b[96+crNameMax:])
	fl := le.Uint32(b[16:])
	r.Live = fl&crFlagLive != 0
	copy(r.Source[:], b[32:48])
	copy(r.Target[:], b[48:64])
	if fl&^crFlagLive != 0 || r.State < CopyRunning || r.State > CopyFailed || r.Size <= 0 || r.Size%BlockSize != 0 ||
		r.RegionSize < minCopyRegion || r.RegionSize&(r.RegionSize-1) != 0 || r.Regions != (r.Size+r.RegionSize-1)/r.RegionSize ||
		r.Regions > crMaxRegions || !bytes.Equal(b[100+crNameMax:crSlot-4], make([]byte, crSlot-4-100-crNameMax)) {
		return CopyRecord{}, false
	}
	return r, true
}

func (c *Copy) encodeBlock(blk int64, seq uint64) []byte {
	b := AlignedBuffer(crSlot)
	le := binary.LittleEndian
	copy(b, crBlockMagic)
	le.PutUint32(b[4:], uint32(blk))
	le.PutUint64(b[8:], seq)
	copy(b[crBitsOffset:crSlot-4], c.image[blk*crBitsPerBlock/8:(blk+1)*crBitsPerBlock/8])
	le.PutUint32(b[crSlot-4:], crc32.Checksum(b[:crSlot-4], castagnoli))
	return b
}

func decodeBlock(b []byte, blk int64) (seq uint64, bits []byte, ok bool) {
	le := binary.LittleEndian
	if string(b[:4]) != crBlockMagic || le.Uint32(b[4:]) != uint32(blk) ||
		le.Uint32(b[crSlot-4:]) != crc32.Checksum(b[:crSlot-4], castagnoli) {
		return 0, nil, false
	}
	return le.Uint64(b[8:]), b[crBitsOffset : crSlot-4], true
}
