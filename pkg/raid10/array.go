package raid10

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// The Array type, its members' slots, and its lifecycle glue: construction,
// start, Close. The I/O path, failure handling and status sit in their own
// files: barrier.go, read.go, readlarge.go, write.go, workers.go, fail.go,
// status.go.

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
	slowLast atomic.Bool // a request passed the deadline and is waited for (timeoutWait)
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
	slowLast            atomic.Uint64 // stalls past the deadline waited for, not failed (timeoutWait)
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
	// (copy_record.go) lives there, reached only by the raw internal I/O.
	reserved atomic.Int64
	// Copy hooks (copy_hooks.go): cow holds the copies whose source this array is
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
	serving      atomic.Bool  // started (Create or Assemble returned it); see timeoutWait
	slowOps      atomic.Int32 // requests in a slow path outside any bucket
	largeReads   atomic.Int32 // large reads in flight (readlarge.go)
	handoffBelow int64        // in-flight count under which the copies go in parallel
	work         chan *wreq
	reqs         *reqList
	nWorkers     atomic.Int64 // workers started (submit adds on demand)
	spare        atomic.Int64 // workers waiting for a request that no submitter has claimed

	bm *bitmap

	// qos: the per-volume QoS limits of the frontend requests (limit.go).
	qos qosState
	// rates: the background work's rates (rates.go).
	rates rateState

	// epoch is advanced by the deadline monitor; see deadline.go.
	epoch    atomic.Int64
	mtimeout atomic.Int64 // Options.MemberTimeout in ns, < 0 disabled (benchmarks switch it)

	// metaMu serialises superblock writes and member state changes.
	metaMu   sync.Mutex
	zombieMu sync.Mutex
	queuesMu sync.Mutex
	queues   map[*Queue]struct{} // open Queues, for abandonRing (queuesMu)
	zombies  map[any]int         // abandoned member calls still running, by storage (zombieMu)
	// events is the superblocks' event count: changed under metaMu, read
	// without it by Status, which must not wait for a holder of metaMu that
	// waits for a stalled member.
	events        atomic.Uint64
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
		queues:   make(map[*Queue]struct{}),
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

// start launches the first workers (one per member; submit starts more on demand: a node
// holds hundreds of arrays, most of them idle, and the 8 to 32 per member started here before
// were 32 to 128 waiting goroutines per volume), the sync daemon and the bitmap sweeper.
func (a *Array) start() {
	nw := a.geo.n
	a.nWorkers.Store(int64(nw))
	for range nw {
		a.workers.Add(1)
		go a.worker(false)
	}
	a.serving.Store(true)
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
			a.kill(r)
		}
	}
	if a.monitorOn {
		close(a.stop)
		a.bg.Wait()
		a.fails.Wait()
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

// logID is the array's UUID as the logs give it (8-4-4-4-12 hex digits, as the pool names
// its volumes' UUIDs), so that an engine line names its volume.
func (a *Array) logID() string {
	u := a.uuid
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

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
