package raid10

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// handoffLatency is the member write latency above which the two copies of
// a write are issued in parallel (see writePiece).
const handoffLatency = 20 * time.Microsecond

// nBuckets is the number of barrier buckets; array chunk c uses bucket
// c mod nBuckets (md hashes its 64 MiB barrier units the same way).
const (
	nBuckets   = 1024
	bucketMask = nBuckets - 1
)

// bucket is one barrier bucket, padded to its own cache line. pending counts
// requests inside the bucket; barrier is raised by a sync operation (or a
// read-error fix) that needs the chunks of this bucket to itself. The
// request counters live here too: the line is touched anyway.
type bucket struct {
	pending atomic.Int32
	barrier atomic.Int32
	rOps    atomic.Uint64
	wOps    atomic.Uint64
	rBytes  atomic.Uint64
	wBytes  atomic.Uint64
	_       [24]byte
}

// memberRef pairs a member with its identity; a slot's ref changes when the
// member is replaced, so a late error of the old member cannot fail the new.
type memberRef struct {
	m    Member
	uuid [16]byte
	// bad is the member's bad-block list (nil: none); see badblocks.go.
	bad atomic.Pointer[badList]
	// Deadline state (deadline.go): requests running by start epoch, set
	// when one passed the deadline, set and closed when the member is
	// failed.
	out      [epochRing]atomic.Int64
	timedOut atomic.Bool
	gone     atomic.Bool
	dead     chan struct{}
	deadOnce sync.Once
}

// slot is one raid disk position. The fast path reads state and ref with
// atomic loads and updates the counters with atomic adds; every state
// change happens under Array.metaMu.
type slot struct {
	idx      int
	ref      atomic.Pointer[memberRef]
	state    atomic.Int32 // MemberState
	inflight atomic.Int64
	headPos  atomic.Int64 // member offset just after the last read
	wlat     atomic.Int64 // moving average of write latency, ns

	timeouts            atomic.Uint64
	readErrs, writeErrs atomic.Uint64
	readOps, writeOps   atomic.Uint64
	readBytes, wrBytes  atomic.Uint64

	// under metaMu
	broken    atomic.Bool // last copy that errored; see memberFailed
	failing   atomic.Bool // failed, not yet recorded durably; see memberFailed
	sbSeq     uint64
	fullSync  bool  // recovery must copy every chunk, not only dirty regions
	redoDirty bool  // a resumed recovery also redoes dirty regions below recovered
	recovered int64 // member data bytes the recovery has rebuilt (checkpoint)
	_         [64]byte
}

func (s *slot) live() *memberRef {
	st := MemberState(s.state.Load())
	if st == MemberInSync || st == MemberRecovering {
		return s.ref.Load()
	}
	return nil
}

func (s *slot) inSync() *memberRef {
	if MemberState(s.state.Load()) == MemberInSync {
		return s.ref.Load()
	}
	return nil
}

type opKind uint8

const (
	opWrite opKind = iota
	opDiscard
	opZeroes
	opRead      // handed-off reads only (deadline.go)
	opReadPiece // one part of a large read (readlarge.go)
)

// wreq is the preallocated request that hands one copy of a write
// to a worker, so both copies are written concurrently without a goroutine
// or an allocation per request.
type wreq struct {
	s      *slot
	ref    *memberRef
	op     opKind
	p      []byte
	off    int64
	length int64
	fua    bool
	err    error
	done   chan struct{}
	want   int8         // opReadPiece: the copy to read (copyAny, 0, 1)
	raw    bool         // opReadPiece: a copy's own read (no hydrate hook, reserved tail)
	idx    uint32       // position in reqList
	buf    *[]byte      // the call's bounce buffer (submit, worker), owned by the worker
	state  atomic.Int32 // reqPending, reqDone, reqAbandoned
}

// Array is a RAID10 (near=2) array. Its I/O methods are safe for concurrent
// use and take no lock on the fast path; see the package documentation.
type Array struct {
	// geo is the geometry. Grow changes its size fields (size, chunks,
	// regions, dataSize, bmBytes) only with every barrier bucket drained and
	// the sync lock, bitmap lock and metaMu held; the fast path reads the
	// array size from size (atomic) before it enters a bucket.
	geo  geometry
	size atomic.Int64
	// reserved is the tail of the array kept out of Size: a copy record
	// (copy.go) lives there, reached only by the raw internal I/O.
	reserved atomic.Int64
	// Copy hooks (copy.go): cow holds the copies whose source this array is
	// (every write first copies an uncopied region into them); hydrate is
	// the copy whose target this array is (every read or write of an
	// uncopied region first copies it in). nil when none: then the hooks
	// cost one atomic load per request piece.
	hooks  atomic.Pointer[hookSet]
	hookMu sync.Mutex // serialises hook updates
	uuid   [16]byte
	opts   Options
	ctime  uint64
	slots  []*slot

	buckets        []bucket
	barrierMu      sync.Mutex
	barrierCond    *sync.Cond
	barrierWaiters atomic.Int32
	raiseMu        sync.Mutex    // one barrier raiser at a time
	syncWake       chan struct{} // a raiser waits here for pending to drain

	closed       atomic.Bool
	monitorOn    bool         // the deadline monitor runs (start, Assemble)
	slowOps      atomic.Int32 // requests in a slow path outside any bucket
	largeReads   atomic.Int32 // large reads in flight (readlarge.go)
	handoffBelow int64        // in-flight count under which the copies go in parallel
	work         chan *wreq
	reqs         *reqList
	nWorkers     atomic.Int64 // workers started (submit adds on demand)
	spare        atomic.Int64 // workers waiting for a request that no submitter has claimed

	bm *bitmap

	// epoch is advanced by the deadline monitor; see deadline.go.
	epoch    atomic.Int64
	mtimeout atomic.Int64 // Options.MemberTimeout in ns, < 0 disabled (benchmarks switch it)

	// metaMu serialises superblock writes and member state changes.
	metaMu        sync.Mutex
	zombieMu      sync.Mutex
	zombies       map[any]int // abandoned member calls still running, by storage (zombieMu)
	events        uint64
	eventsCleared uint64
	// Live copies from this array (copy.go, under metaMu): how many are
	// running (persisted), the copy generation (persisted), how many
	// ResumeCopy found since Assemble.
	liveCopies, copyGen uint32
	resumedCopies       uint32
	resumed             []*Copy

	// resync: regions whose copies may differ (after an unclean shutdown or
	// a create without AssumeClean). Reads there use the first copy.
	resyncActive atomic.Bool
	resyncNeedP  atomic.Pointer[[]atomic.Uint64] // one bit per region; Grow replaces it

	syncRun sync.Mutex // held by the daemon and scrubs while they run
	kick    chan struct{}
	stop    chan struct{}
	bg      sync.WaitGroup
	workers sync.WaitGroup
	late    sync.WaitGroup // goroutines of member calls that may outlive their caller
	fails   sync.WaitGroup // member failures the deadline monitor began

	progMu    sync.Mutex
	prog      SyncProgress
	progBase  int64 // Done at the start (a resumed scrub), left out of the rate
	syncStart time.Time
	lastFg    uint64
}

func newArray(geo geometry, uuid [16]byte, opts Options) *Array {
	if opts.SyncRateMin == 0 {
		opts.SyncRateMin = DefaultSyncRateMin
	}
	if opts.SyncRateMax == 0 {
		opts.SyncRateMax = DefaultSyncRateMax
	}
	if opts.BitmapClearDelay <= 0 {
		opts.BitmapClearDelay = 5 * time.Second
	}
	if opts.MemberTimeout == 0 {
		opts.MemberTimeout = DefaultMemberTimeout
	}
	a := &Array{
		geo:      geo,
		uuid:     uuid,
		opts:     opts,
		slots:    make([]*slot, geo.n),
		buckets:  make([]bucket, nBuckets),
		syncWake: make(chan struct{}, 1),
		work:     make(chan *wreq, 256),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		zombies:  make(map[any]int),
	}
	a.barrierCond = sync.NewCond(&a.barrierMu)
	a.size.Store(geo.size)
	need := make([]atomic.Uint64, (geo.regions+63)/64)
	a.resyncNeedP.Store(&need)
	a.mtimeout.Store(int64(opts.MemberTimeout))
	a.handoffBelow = int64(runtime.GOMAXPROCS(0))
	for i := range a.slots {
		s := &slot{idx: i}
		s.state.Store(int32(MemberMissing))
		a.slots[i] = s
	}
	a.bm = newBitmap(a)
	a.reqs = newReqList(cap(a.work))
	return a
}

// start launches the write workers, the sync daemon and the bitmap sweeper.
func (a *Array) start() {
	nw := max(8, 2*runtime.GOMAXPROCS(0)) * a.geo.n
	a.nWorkers.Store(int64(nw))
	for range nw {
		a.workers.Add(1)
		go a.worker(false)
	}
	a.bg.Add(2)
	go a.syncDaemon()
	go a.bm.sweeper()
	a.startMonitor()
	a.kickSync()
}

// startMonitor starts the deadline monitor (deadline.go) if the deadline is
// in force and it is not running yet: Assemble starts it before its first
// metadata I/O.
func (a *Array) startMonitor() {
	if a.timeout() > 0 && !a.monitorOn {
		a.monitorOn = true
		a.bg.Add(1)
		go a.deadlineMonitor()
	}
}

// abandon ends an array that Create or Assemble gives up on before it
// starts: every member's calls are abandoned (a call still inside a hung
// member is never waited for), the monitor stops, and the member failures
// it began are waited for (they end at once: each call they make now fails
// at once). The members are not closed.
func (a *Array) abandonStart() {
	for _, s := range a.slots {
		if r := s.ref.Load(); r != nil {
			r.timedOut.Store(true)
			r.kill()
		}
	}
	if a.monitorOn {
		close(a.stop)
		a.bg.Wait()
		a.fails.Wait()
	}
}

// submit hands req to a worker of its own: it claims a spare worker (one
// waiting for a request that no other submitter has claimed) or starts one
// more. So a request never queues behind busy workers, whatever they wait
// for: a part of a large read may wait on a worker for a barrier whose
// raiser waits for a member call it handed off (readlarge.go); that call
// has its own worker. The workers never outnumber the preallocated
// requests: a busy worker holds one, and a worker starts only for a request
// no spare one can take. Workers stay for the array's life.
func (a *Array) submit(req *wreq) {
	if req.op == opWrite && len(req.p) > 0 {
		// The worker writes from a buffer of its own: if the call is
		// abandoned (deadline.go), the caller reuses its buffer at once.
		b := getBounce(len(req.p))
		copy(*b, req.p)
		req.buf, req.p = b, (*b)[:len(req.p)]
	}
	for {
		n := a.spare.Load()
		if n <= 0 {
			a.nWorkers.Add(1)
			a.workers.Add(1)
			go a.worker(true)
			break
		}
		if a.spare.CompareAndSwap(n, n-1) {
			break
		}
	}
	a.work <- req
}

// worker runs handed-off requests. A worker counts itself spare before it
// waits for a request, unless a submitter started it for its own (claimed):
// then the spare workers plus the started ones are never fewer than the
// requests queued.
func (a *Array) worker(claimed bool) {
	defer a.workers.Done()
	for {
		if !claimed {
			a.spare.Add(1)
		}
		claimed = false
		r, ok := <-a.work
		if !ok {
			return
		}
		switch r.op {
		case opReadPiece:
			r.err = a.readPiece(r.p, r.off, int(r.want), r.raw)
		case opRead:
			r.buf = getBounce(len(r.p))
			r.err = a.memberRead(r.s, r.ref, (*r.buf)[:len(r.p)], r.off)
		default:
			r.err = a.memberWrite(r.s, r.ref, r.op, r.p, r.off, r.length, r.fua)
		}
		a.complete(r)
	}
}

// Created is when the array was created (its superblocks' creation time).
func (a *Array) Created() time.Time { return time.Unix(0, int64(a.ctime)) }

// Size is the usable size of the array in bytes (less a reserved tail:
// see Reserve).
func (a *Array) Size() int64 { return a.size.Load() - a.reserved.Load() }

// Reserve keeps the last n bytes of the array out of Size and out of
// reach of ReadAt, WriteAt and the others: a copy target keeps its copy
// record there (CopyRecordSize). It is not persisted: the owner calls it
// after Create and after every Assemble, before serving the array.
func (a *Array) Reserve(n int64) error {
	if n < 0 || n%BlockSize != 0 || n >= a.size.Load() {
		return invalidf("reserve %d bytes of a %d-byte array", n, a.size.Load())
	}
	a.reserved.Store(n)
	return nil
}

// ChunkSize is the chunk size in bytes.
func (a *Array) ChunkSize() int64 { return a.geo.chunk }

// UUID is the array UUID.
func (a *Array) UUID() [16]byte { return a.uuid }

func (a *Array) check(off, n int64, raw bool) error {
	if off < 0 || n < 0 || off%BlockSize != 0 || n%BlockSize != 0 {
		return invalidf("request [%d,+%d) not aligned to %d", off, n, BlockSize)
	}
	size := a.size.Load()
	if !raw {
		size -= a.reserved.Load()
	}
	if off+n > size {
		return invalidf("request [%d,+%d) beyond the array size %d", off, n, size)
	}
	return nil
}

// enter admits a request into the bucket of chunk c. Without a raised
// barrier it is one atomic add and one load on the bucket's cache line.
func (a *Array) enter(c int64) (*bucket, error) {
	bk := &a.buckets[c&bucketMask]
	for {
		bk.pending.Add(1)
		if bk.barrier.Load() == 0 {
			if a.closed.Load() {
				a.exit(bk)
				return nil, ErrClosed
			}
			return bk, nil
		}
		a.exit(bk)
		a.barrierMu.Lock()
		a.barrierWaiters.Add(1)
		for bk.barrier.Load() != 0 {
			a.barrierCond.Wait()
		}
		a.barrierWaiters.Add(-1)
		a.barrierMu.Unlock()
	}
}

// exit leaves the bucket; it wakes a raiser only if one waits for it.
func (a *Array) exit(bk *bucket) {
	if bk.pending.Add(-1) == 0 && bk.barrier.Load() != 0 {
		select {
		case a.syncWake <- struct{}{}:
		default:
		}
	}
}

// raise takes the barrier of chunk c's bucket and waits until no request is
// inside it. Only sync operations and read-error fixes call it.
func (a *Array) raise(c int64) *bucket {
	a.raiseMu.Lock()
	bk := &a.buckets[c&bucketMask]
	bk.barrier.Add(1)
	if bk.pending.Load() != 0 {
		t := time.NewTimer(time.Millisecond)
		for bk.pending.Load() != 0 {
			select {
			case <-a.syncWake:
			case <-t.C:
				t.Reset(time.Millisecond)
			}
		}
		t.Stop()
	}
	return bk
}

func (a *Array) lower(bk *bucket) {
	bk.barrier.Add(-1)
	a.raiseMu.Unlock()
	if a.barrierWaiters.Load() > 0 {
		a.barrierMu.Lock()
		a.barrierCond.Broadcast()
		a.barrierMu.Unlock()
	}
}

// resyncNeed returns the resync bits (one per region).
func (a *Array) resyncNeed() []atomic.Uint64 { return *a.resyncNeedP.Load() }

func (a *Array) regionNeedsResync(r int64) bool {
	return a.resyncNeed()[r>>6].Load()&(1<<(r&63)) != 0
}

// readPiece reads within one chunk, from the copy want (0: the chunk's
// first, 1: its second) when both are in sync and no resync is pending
// there, else (and for copyAny) from the one the balancing picks. A raw
// read (the copy's own I/O) skips the hydrate hook.
func (a *Array) readPiece(p []byte, aoff int64, want int, raw bool) error {
	c := aoff >> a.geo.chunkShift
	bk, err := a.enter(c)
	if err != nil {
		return err
	}
	for !raw {
		// Checked inside the bucket: a copy installs its hook with every
		// bucket drained (freeze), so a piece admitted after that sees it.
		h, r := a.pendingHydrate(aoff, int64(len(p)))
		if h == nil {
			break
		}
		a.exit(bk)
		if err := h.ensure(r, (aoff+int64(len(p))-1)>>h.shift, true); err != nil {
			return err
		}
		if bk, err = a.enter(c); err != nil {
			return err
		}
	}
	bk.rOps.Add(1)
	bk.rBytes.Add(uint64(len(p)))
	within := aoff & (a.geo.chunk - 1)
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	s0, s1 := a.slots[d0], a.slots[d1]
	o0 += within
	o1 += within
	r0, r1 := s0.inSync(), s1.inSync()
	if r0 != nil && r1 != nil {
		// Prefer the less loaded copy, then the one whose head is nearer.
		swap := false
		if a.resyncActive.Load() && a.regionNeedsResync(aoff/a.geo.region) {
			swap = false // copies may differ: always the first
		} else if want != copyAny {
			swap = want == 1
		} else if i0, i1 := s0.inflight.Load(), s1.inflight.Load(); i1 < i0 {
			swap = true
		} else if i1 == i0 && absDist(s1.headPos.Load(), o1) < absDist(s0.headPos.Load(), o0) {
			swap = true
		}
		if swap {
			s0, r0, o0 = s1, r1, o1
		}
	} else if r0 == nil {
		s0, r0, o0 = s1, r1, o1
	}
	if r0 == nil {
		a.exit(bk)
		return fmt.Errorf("%w: no in-sync copy of chunk %d", ErrIO, c)
	}
	// A copy marked bad there goes straight to the slow path.
	if l := r0.bad.Load(); l == nil || !l.overlaps(o0/BlockSize, int64(len(p))/BlockSize) {
		ok := false
		if a.rescue(s0) {
			err, ok = a.handedOff(s0, r0, opRead, p, o0, int64(len(p)), false)
		}
		if !ok {
			err = a.memberRead(s0, r0, p, o0)
		}
		if err == nil {
			a.exit(bk)
			return nil
		}
		s0.readErrs.Add(1)
		klog.V(2).InfoS("raid10: read error", "member", s0.idx, "offset", o0, "err", err)
	}
	// The slow path raises this bucket's barrier, so leave the bucket
	// first; the slow-path counter keeps Close waiting for it.
	a.slowOps.Add(1)
	defer a.slowOps.Add(-1)
	a.exit(bk)
	return a.readSlow(p, aoff, c)
}

// readSlow serves a read that met a read error or a bad block: with the
// chunk's barrier raised (no write races it), block by block from a good
// copy, rewriting the copy that failed (see syncRange). Blocks that have no
// good copy are recorded bad and fail the read with EIO; nothing else is
// returned for them.
func (a *Array) readSlow(p []byte, aoff, c int64) error {
	bk := a.raise(c)
	defer a.lower(bk)
	if lost, _ := a.syncRange(c, aoff&(a.geo.chunk-1), p, modeRead, nil); lost > 0 {
		return fmt.Errorf("%w: %d blocks of chunk %d have no good copy", ErrIO, lost, c)
	}
	return nil
}

func absDist(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

func (a *Array) memberRead(s *slot, r *memberRef, p []byte, off int64) error {
	if err := r.refused(); err != nil {
		return err
	}
	out := &r.out[a.epoch.Load()%epochRing]
	out.Add(1)
	s.inflight.Add(1)
	// Sample the latency of one read in 16 (see rescue).
	var t0 time.Time
	sample := s.readOps.Load()&15 == 0
	if sample {
		t0 = time.Now()
	}
	n, err := r.m.ReadAt(p, off)
	s.inflight.Add(-1)
	out.Add(-1)
	if sample {
		lat := int64(time.Since(t0))
		old := s.wlat.Load()
		s.wlat.Store(old + (lat-old)/8)
	}
	s.headPos.Store(off + int64(n))
	s.readOps.Add(1)
	s.readBytes.Add(uint64(n))
	if err == nil && n != len(p) {
		err = fmt.Errorf("short read %d of %d", n, len(p))
	}
	return err
}

// WriteAt writes p at off to every live copy concurrently and returns when
// all have it. off and len(p) must be multiples of BlockSize.
func (a *Array) WriteAt(p []byte, off int64) (int, error) {
	return a.write(opWrite, p, off, int64(len(p)), false, false)
}

// WriteAtFUA is WriteAt followed by a flush of the members written, so the
// data is durable on every live copy before it returns.
func (a *Array) WriteAtFUA(p []byte, off int64) (int, error) {
	return a.write(opWrite, p, off, int64(len(p)), true, false)
}

// Discard passes a discard of [off, off+length) to the members. The range
// reads back as unspecified data (zeroes on file members).
func (a *Array) Discard(off, length int64) error {
	_, err := a.write(opDiscard, nil, off, length, false, false)
	return err
}

// WriteZeroes makes [off, off+length) read back as zeroes on every copy.
func (a *Array) WriteZeroes(off, length int64) error {
	_, err := a.write(opZeroes, nil, off, length, false, false)
	return err
}

// write splits a request into chunk pieces; raw requests (a copy's own
// I/O) reach the reserved tail and skip the copy hooks.
func (a *Array) write(op opKind, p []byte, off, length int64, fua, raw bool) (int, error) {
	if err := a.check(off, length, raw); err != nil {
		return 0, err
	}
	var done int64
	for done < length {
		aoff := off + done
		n := min(length-done, a.geo.chunk-aoff&(a.geo.chunk-1))
		var q []byte
		if p != nil {
			q = p[done : done+n]
		}
		if err := a.writePiece(op, q, aoff, n, fua, raw); err != nil {
			return int(done), err
		}
		done += n
	}
	return int(done), nil
}

func (a *Array) writePiece(op opKind, p []byte, aoff, length int64, fua, raw bool) error {
	c := aoff >> a.geo.chunkShift
	bk, err := a.enter(c)
	if err != nil {
		return err
	}
	// The copy hooks, checked inside the bucket (see readPiece): each region
	// of the piece whose bit is clear is copied first, outside the bucket,
	// then the piece is admitted again.
	for !raw {
		h, r, target := a.pendingCopy(aoff, length)
		if h == nil {
			break
		}
		a.exit(bk)
		if err := h.ensure(r, (aoff+length-1)>>h.shift, target); err != nil {
			return err
		}
		if bk, err = a.enter(c); err != nil {
			return err
		}
	}
	defer a.exit(bk)
	bk.wOps.Add(1)
	bk.wBytes.Add(uint64(length))
	region := aoff / a.geo.region
	if err := a.bm.startWrite(region); err != nil {
		return err
	}
	defer a.bm.endWrite(region)
	within := aoff & (a.geo.chunk - 1)
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	s0, s1 := a.slots[d0], a.slots[d1]
	o0 += within
	o1 += within
	r0, r1 := s0.live(), s1.live()
	// in-sync status at submission: only those copies count for the ack.
	sync0 := r0 != nil && MemberState(s0.state.Load()) == MemberInSync
	sync1 := r1 != nil && MemberState(s1.state.Load()) == MemberInSync
	// Copies go to workers where the member deadline can abandon them
	// (deadline.go), and the second copy also when few requests are in
	// flight on members with device latency, so both are written at once.
	// With a queue already, the submitters themselves give the parallelism,
	// and a write that completes in memory (tmpfs, page cache) costs less
	// than the hand-off, so the submitter then writes both in turn.
	ss, rs, os := [2]*slot{s0, s1}, [2]*memberRef{r0, r1}, [2]int64{o0, o1}
	par := r0 != nil && r1 != nil && s0.inflight.Load()+s1.inflight.Load() < a.handoffBelow &&
		min(s0.wlat.Load(), s1.wlat.Load()) >= int64(handoffLatency)
	var reqs [2]*wreq
	var es [2]error
	for k := range rs {
		if rs[k] == nil || !a.rescue(ss[k]) && (k != 1 || !par) {
			continue
		}
		if req := a.reqs.pop(); req != nil {
			req.s, req.ref, req.op, req.p, req.off, req.length, req.fua = ss[k], rs[k], op, p, os[k], length, fua
			a.submit(req)
			reqs[k] = req
		}
	}
	for k := range rs {
		if rs[k] != nil && reqs[k] == nil {
			es[k] = a.memberWrite(ss[k], rs[k], op, p, os[k], length, fua)
		}
	}
	for k := range rs {
		if reqs[k] != nil {
			es[k] = a.await(reqs[k])
		}
	}
	e0, e1 := es[0], es[1]
	// A copy that was recovering at submission counts as well if it is in
	// sync now, before the bucket is left (md's rule: In_sync at completion).
	// The recovery cannot copy this chunk while the write holds the bucket, so
	// if it has finished, it copied this chunk before the write, and the copy
	// holds the write. (Found by TestModel: a recovery ended during a write
	// whose only in-sync copy failed; the write was refused though the
	// recovered copy had taken it.)
	if r0 != nil && e0 == nil && !sync0 {
		sync0 = s0.inSync() == r0
	}
	if r1 != nil && e1 == nil && !sync1 {
		sync1 = s1.inSync() == r1
	}
	// Acknowledge only if some in-sync copy took the write and every copy
	// that did not is durably failed: a copy that errored but could not be
	// failed (the last one of some chunk: broken) still counts as in sync
	// on disk, and a resync after a crash could copy its stale data back.
	ok, lost := false, false
	if r0 != nil {
		if e0 != nil {
			lost = lost || !a.failed(s0, r0, e0, o0, length)
		} else if sync0 {
			ok = true
		}
	}
	if r1 != nil {
		if e1 != nil {
			lost = lost || !a.failed(s1, r1, e1, o1, length)
		} else if sync1 {
			ok = true
		}
	}
	if !ok || lost {
		// The copies may differ now: make them equal again (the region's
		// bit stays set until then, and an unclean Close keeps it).
		a.markResync(region)
		return fmt.Errorf("%w: chunk %d: no in-sync copy took the write, or a copy that missed it could not be failed", ErrIO, c)
	}
	// A write that put data on a copy's bad blocks makes them good there
	// (a discard does not: it leaves the contents unspecified).
	if op != opDiscard {
		if r0 != nil && e0 == nil && r0.bad.Load().overlaps(o0/BlockSize, length/BlockSize) {
			a.clearBad(s0, r0, o0, length)
		}
		if r1 != nil && e1 == nil && r1.bad.Load().overlaps(o1/BlockSize, length/BlockSize) {
			a.clearBad(s1, r1, o1, length)
		}
	}
	return nil
}

func (a *Array) memberWrite(s *slot, r *memberRef, op opKind, p []byte, off, length int64, fua bool) error {
	if err := r.refused(); err != nil {
		s.writeErrs.Add(1)
		return err
	}
	out := &r.out[a.epoch.Load()%epochRing]
	out.Add(1)
	defer out.Add(-1)
	s.inflight.Add(1)
	// Sample the latency of one write in 16 for the hand-off decision.
	var t0 time.Time
	sample := op == opWrite && !fua && s.writeOps.Load()&15 == 0
	if sample {
		t0 = time.Now()
	}
	var err error
	switch op {
	case opWrite:
		var n int
		n, err = r.m.WriteAt(p, off)
		if err == nil && n != len(p) {
			err = fmt.Errorf("short write %d of %d", n, len(p))
		}
	case opDiscard:
		err = r.m.Discard(off, length)
	case opZeroes:
		err = r.m.WriteZeroes(off, length)
	}
	if err == nil && fua {
		err = r.m.Flush()
	}
	s.inflight.Add(-1)
	if sample {
		lat := int64(time.Since(t0))
		old := s.wlat.Load()
		s.wlat.Store(old + (lat-old)/8) // racy EWMA: a hint, lost updates are fine
	}
	s.writeOps.Add(1)
	s.wrBytes.Add(uint64(length))
	if err != nil {
		s.writeErrs.Add(1)
	}
	return err
}

// Flush makes every acknowledged write durable on every live member. A
// member whose flush fails is failed; Flush fails only if some chunk is
// left without a durable in-sync copy.
func (a *Array) Flush() error {
	if a.closed.Load() {
		return ErrClosed
	}
	errs := make([]error, len(a.slots))
	refs := make([]*memberRef, len(a.slots))
	done := make([]chan error, len(a.slots))
	for i, s := range a.slots {
		r := s.live()
		if r == nil {
			continue
		}
		refs[i] = r
		done[i] = make(chan error, 1)
		a.late.Add(1)
		go func() {
			defer a.late.Done()
			done[i] <- a.memberFlush(r)
		}()
	}
	for i := range a.slots {
		if done[i] == nil {
			continue
		}
		// A flush stuck past the deadline is abandoned with its member.
		select {
		case errs[i] = <-done[i]:
		case <-refs[i].dead:
			errs[i] = errTimedOut
		}
	}
	for i, s := range a.slots {
		if errs[i] != nil {
			a.memberFailed(s, refs[i], "flush", errs[i])
		}
	}
	if a.State() == ArrayFailed {
		return fmt.Errorf("%w: array failed", ErrIO)
	}
	return nil
}

// memberFlush flushes r, counted for the member deadline.
func (a *Array) memberFlush(r *memberRef) error {
	if err := r.refused(); err != nil {
		return err
	}
	out := &r.out[a.epoch.Load()%epochRing]
	out.Add(1)
	defer out.Add(-1)
	return r.m.Flush()
}

// memberFailed fails the slot (unless its member was replaced meanwhile).
// The failure is in the superblocks of the remaining members before any
// write skips the member: until then the slot is only "failing", writes
// still go to it, and one that errors waits here on metaMu. So a write
// acknowledged on one copy can never be read back from the stale one after
// a crash. As md does, the last in-sync copy of some chunk is never failed:
// it is marked broken instead (the array reports Failed, I/O that needs it
// fails) and its superblock stays as it was, so the array can be assembled
// again once the member is back.
func (a *Array) memberFailed(s *slot, r *memberRef, op string, err error) {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	a.memberFailedLocked(s, r, op, err)
}

// memberFailedLocked is memberFailed with metaMu held.
func (a *Array) memberFailedLocked(s *slot, r *memberRef, op string, err error) {
	if s.ref.Load() != r {
		return
	}
	st := MemberState(s.state.Load())
	if st == MemberFaulty || st == MemberMissing {
		return
	}
	if !a.canFailLocked(s) {
		if !s.broken.Swap(true) {
			klog.ErrorS(err, "raid10: last copy failed, array failed", "member", s.idx, "op", op)
		}
		return
	}
	klog.ErrorS(err, "raid10: member failed", "member", s.idx, "op", op)
	s.failing.Store(true)
	a.writeSuperblocksLocked(true, false)
}

// failed handles a write error of member s on member bytes [off,
// off+length) and reports whether that copy can no longer be read as
// current: the member is durably failed (or was replaced meanwhile), or,
// where it holds the last in-sync copy of some other chunk and cannot be
// failed, the range is durably recorded in its bad-block list (as md's
// narrow_write_error does). Otherwise the member is broken and false.
func (a *Array) failed(s *slot, r *memberRef, err error, off, length int64) bool {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	if s.ref.Load() != r {
		return true
	}
	if st := MemberState(s.state.Load()); st == MemberFaulty || st == MemberMissing {
		return true
	}
	if !a.canFailLocked(s) && length > 0 {
		if a.recordBadLocked(s, r, off, length) {
			klog.ErrorS(err, "raid10: write error on a member holding a last copy: range recorded bad", "member", s.idx, "offset", off, "length", length)
			return true
		}
	}
	a.memberFailedLocked(s, r, "write", err)
	return s.ref.Load() != r || MemberState(s.state.Load()) != MemberInSync
}

// canFailLocked reports whether s may be failed: it must not hold the last
// in-sync copy of any chunk. Caller holds metaMu.
func (a *Array) canFailLocked(s *slot) bool {
	if MemberState(s.state.Load()) != MemberInSync {
		return true
	}
	for _, p := range a.geo.pairs() {
		other := -1
		if p[0] == s.idx {
			other = p[1]
		} else if p[1] == s.idx {
			other = p[0]
		}
		if other >= 0 && (MemberState(a.slots[other].state.Load()) != MemberInSync || a.slots[other].failing.Load()) {
			return false
		}
	}
	return true
}

// FailMember marks slot faulty, as mdadm --fail does.
func (a *Array) FailMember(slot int) error {
	if slot < 0 || slot >= len(a.slots) {
		return invalidf("slot %d of %d", slot, len(a.slots))
	}
	s := a.slots[slot]
	r := s.ref.Load()
	if r == nil {
		return nil
	}
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	if st := MemberState(s.state.Load()); st == MemberFaulty || st == MemberMissing {
		return nil
	}
	if !a.canFailLocked(s) {
		return fmt.Errorf("%w: slot %d", ErrLastCopy, slot)
	}
	klog.InfoS("raid10: member failed by request", "member", slot)
	s.failing.Store(true)
	a.writeSuperblocksLocked(true, false)
	if MemberState(s.state.Load()) != MemberFaulty {
		return fmt.Errorf("%w: slot %d: no member could record the failure", ErrIO, slot)
	}
	return nil
}

// State is the array state now.
func (a *Array) State() ArrayState {
	if a.closed.Load() {
		return ArrayClosed
	}
	return a.stateLocked()
}

func (a *Array) stateLocked() ArrayState {
	st := ArrayOptimal
	for _, s := range a.slots {
		if s.broken.Load() {
			return ArrayFailed
		}
		if MemberState(s.state.Load()) != MemberInSync {
			st = ArrayDegraded
		} else if r := s.ref.Load(); r != nil && r.bad.Load() != nil {
			st = ArrayDegraded // some blocks have one good copy or none
		}
	}
	if st == ArrayOptimal {
		return st
	}
	for _, p := range a.geo.pairs() {
		if MemberState(a.slots[p[0]].state.Load()) != MemberInSync && MemberState(a.slots[p[1]].state.Load()) != MemberInSync {
			return ArrayFailed
		}
	}
	return st
}

// anyBroken reports whether some member failed but could not be marked
// faulty: it may have missed writes, so no bitmap bit may be cleared.
func (a *Array) anyBroken() bool {
	for _, s := range a.slots {
		if s.broken.Load() {
			return true
		}
	}
	return false
}

func (a *Array) allInSync() bool {
	for _, s := range a.slots {
		if MemberState(s.state.Load()) != MemberInSync {
			return false
		}
	}
	return true
}

// Status returns a snapshot of the array.
func (a *Array) Status() Status {
	st := Status{
		UUID:       a.uuid,
		Size:       a.Size(),
		ChunkSize:  a.geo.chunk,
		RegionSize: a.geo.region,
		RaidDisks:  a.geo.n,
	}
	a.metaMu.Lock()
	st.Events = a.events
	a.metaMu.Unlock()
	for i := range a.buckets {
		b := &a.buckets[i]
		st.ReadOps += b.rOps.Load()
		st.WriteOps += b.wOps.Load()
		st.ReadBytes += b.rBytes.Load()
		st.WriteBytes += b.wBytes.Load()
	}
	for _, s := range a.slots {
		ms := MemberStatus{
			Slot:        s.idx,
			State:       MemberState(s.state.Load()),
			ReadErrors:  s.readErrs.Load(),
			WriteErrors: s.writeErrs.Load(),
			ReadOps:     s.readOps.Load(),
			WriteOps:    s.writeOps.Load(),
			ReadBytes:   s.readBytes.Load(),
			WriteBytes:  s.wrBytes.Load(),
			InFlight:    s.inflight.Load(),
			TimedOut:    s.timeouts.Load(),
		}
		if r := s.ref.Load(); r != nil {
			ms.UUID = r.uuid
			if s.live() == r {
				ms.BadBlocks = r.bad.Load().blocks()
			}
		}
		st.Members = append(st.Members, ms)
	}
	st.BadBlocks, st.LostBlocks = a.badBlockCounts()
	// After the members: a member seen failed is never beside an Optimal
	// state (a state read first could predate the failure).
	st.State = a.State()
	st.DirtyRegions = a.bm.dirtyCount()
	st.Sync = a.progress()
	return st
}

// Close waits for the requests in flight, stops the background work,
// flushes the members, clears the bitmap if the array is in sync, marks the
// superblocks clean and closes the members. It is idempotent.
func (a *Array) Close() error {
	if !a.closed.CompareAndSwap(false, true) {
		return nil
	}
	for i := range a.buckets {
		for a.buckets[i].pending.Load() != 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	for a.slowOps.Load() != 0 {
		time.Sleep(100 * time.Microsecond)
	}
	close(a.stop)
	a.bg.Wait()
	// A scrub the caller runs (Check, CheckRange, ...) holds syncRun and
	// hands member calls to the workers: it stops at its next chunk now that
	// stop is closed, and the workers must outlive it.
	a.syncRun.Lock()
	defer a.syncRun.Unlock()
	close(a.work)
	a.waitWorkers()
	var firstErr error
	for _, s := range a.slots {
		if r := s.live(); r != nil {
			if err := r.m.Flush(); err != nil {
				a.memberFailed(s, r, "flush", err)
			}
		}
	}
	a.bm.clearAllIfClean()
	a.metaMu.Lock()
	clean := !a.resyncPending()
	a.writeSuperblocksLocked(true, clean)
	a.metaMu.Unlock()
	for _, s := range a.slots {
		if r := s.ref.Load(); r != nil {
			if err := r.m.Close(); err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	return firstErr
}

// waitWorkers waits for the write workers to end; one still inside an
// abandoned member call (deadline.go) is not waited for past the deadline.
func (a *Array) waitWorkers() {
	done := make(chan struct{})
	go func() {
		a.workers.Wait()
		close(done)
	}()
	if d := a.timeout(); d > 0 {
		select {
		case <-done:
		case <-time.After(d):
			klog.InfoS("raid10: closing with abandoned member requests still running")
		}
		return
	}
	<-done
}

func (a *Array) resyncPending() bool {
	need := a.resyncNeed()
	for i := range need {
		if need[i].Load() != 0 {
			return true
		}
	}
	return false
}
