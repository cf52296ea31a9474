package raid10

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Per-volume QoS limits: token buckets on the requests that enter through
// the frontends (ReadAt, WriteAt, WriteAtFUA, Discard, WriteZeroes and a
// Queue's Read and Write). A request over a limit waits; it is never failed.
//
// Each bucket is a GCRA (the virtual-scheduling form of a token bucket):
// one atomic word, the theoretical arrival time tat, the instant at which
// the bucket would be full again. A request of cost n moves it to
// max(tat, now) + n*interval with one compare-and-swap and waits
// tat' - burst*interval - now when that is positive. A request reserves its
// turn before it waits, so requests are served in the order they reserved,
// and a request larger than the burst waits for its share instead of being
// refused.
//
// golang.org/x/time/rate (an indirect dependency already) was considered
// and not used: every Reserve, Allow and Wait takes the Limiter's mutex,
// Reserve returns a heap-allocated Reservation, WaitN allocates a timer per
// wait and refuses a request larger than the burst (a 1 MiB write under a
// smaller byte burst would fail instead of waiting).

// Limits are a volume's QoS limits. A rate of 0 is unlimited. A burst is
// the amount a bucket holds when full (requests or bytes that pass at once
// after an idle time); 0 takes DefaultBurst's share of the rate. A burst
// without its rate is ignored. Discard and WriteZeroes count as one write
// request and no bytes (they move no data through the frontend, and mkfs
// issues them over the whole volume). The engine's own I/O (resync,
// recovery, scrub, copies) is not counted.
type Limits struct {
	// ReadIOPS is read requests per second; ReadIOPSBurst, requests.
	ReadIOPS, ReadIOPSBurst int64
	// WriteIOPS is write requests per second (Discard and WriteZeroes
	// included); WriteIOPSBurst, requests.
	WriteIOPS, WriteIOPSBurst int64
	// ReadBytesPerSecond is bytes read per second; ReadBytesBurst, bytes.
	ReadBytesPerSecond, ReadBytesBurst int64
	// WriteBytesPerSecond is bytes written per second; WriteBytesBurst,
	// bytes.
	WriteBytesPerSecond, WriteBytesBurst int64
}

// DefaultBurst is the share of a second a bucket holds when its burst is 0:
// a rate of 1000 IOPS passes 100 requests at once after an idle time. It
// also leaves room for the oversleep of the timers, so the long-run rate
// stays at the limit.
const DefaultBurst = 100 * time.Millisecond

// maxBurstNanos caps a bucket's burst in time (rate*burst may not overflow
// the bucket's clock arithmetic).
const maxBurstNanos = int64(24 * time.Hour)

// ThrottleStatus counts the frontend requests that Limits delayed.
type ThrottleStatus struct {
	// ReadsDelayed and WritesDelayed count the requests that waited.
	ReadsDelayed, WritesDelayed uint64
	// ReadDelay and WriteDelay are the total time they waited.
	ReadDelay, WriteDelay time.Duration
	// ReadBytesDelayed and WriteBytesDelayed are the bytes those requests
	// moved (a delayed discard or write-zeroes moves none).
	ReadBytesDelayed, WriteBytesDelayed uint64
}

// Validate reports the first negative field, by name.
func (l Limits) Validate() error {
	for _, f := range l.fields() {
		if *f.v < 0 {
			return invalidf("limit %s is negative (%d)", f.name, *f.v)
		}
	}
	return nil
}

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool {
	return l.ReadIOPS == 0 && l.WriteIOPS == 0 && l.ReadBytesPerSecond == 0 && l.WriteBytesPerSecond == 0
}

type limitField struct {
	name string
	v    *int64
}

func (l *Limits) fields() [8]limitField {
	return [8]limitField{
		{"ReadIOPS", &l.ReadIOPS}, {"ReadIOPSBurst", &l.ReadIOPSBurst},
		{"WriteIOPS", &l.WriteIOPS}, {"WriteIOPSBurst", &l.WriteIOPSBurst},
		{"ReadBytesPerSecond", &l.ReadBytesPerSecond}, {"ReadBytesBurst", &l.ReadBytesBurst},
		{"WriteBytesPerSecond", &l.WriteBytesPerSecond}, {"WriteBytesBurst", &l.WriteBytesBurst},
	}
}

// normalized returns l with the bursts in force: the default for a rate
// without one, 0 for a burst without a rate.
func (l Limits) normalized() Limits {
	f := l.fields()
	for i := 0; i < len(f); i += 2 {
		rate, burst := f[i].v, f[i+1].v
		switch {
		case *rate == 0:
			*burst = 0
		case *burst == 0:
			*burst = max(1, int64(float64(*rate)*DefaultBurst.Seconds()))
		}
	}
	return l
}

// tokenBucket is one GCRA bucket (see above). An interval of 0: unlimited.
type tokenBucket struct {
	tat      atomic.Int64 // ns since the limiter's base
	interval float64      // ns per request or byte
	burst    int64        // ns: burst * interval
}

// limitDir is the buckets of one direction, in one cache line (a request
// takes from both), apart from the other direction's.
type limitDir struct {
	ops, bytes tokenBucket
	_          [64 - 48]byte
}

func (b *tokenBucket) set(rate, burst int64) {
	if rate == 0 {
		return
	}
	b.interval = 1e9 / float64(rate)
	b.burst = int64(min(float64(burst)*b.interval, float64(maxBurstNanos)))
}

// take reserves n units at now and returns how long the caller waits (<= 0:
// none).
func (b *tokenBucket) take(now, n int64) int64 {
	if b.interval == 0 {
		return 0
	}
	cost := int64(min(float64(n)*b.interval, math.MaxInt64/4))
	for {
		tat := b.tat.Load()
		next := max(tat, now) + cost
		if b.tat.CompareAndSwap(tat, next) {
			return next - b.burst - now
		}
	}
}

// limiter is one setting of Limits. SetLimits replaces it whole and closes
// changed, so the requests waiting on it reserve again under the new one.
type limiter struct {
	limits  Limits // normalized
	base    time.Time
	changed chan struct{}
	_       [64]byte    // the buckets apart from the fields above, read by every request
	dir     [2]limitDir // read, write
}

func newLimiter(l Limits) *limiter {
	lm := &limiter{limits: l, base: time.Now(), changed: make(chan struct{})}
	lm.dir[0].ops.set(l.ReadIOPS, l.ReadIOPSBurst)
	lm.dir[0].bytes.set(l.ReadBytesPerSecond, l.ReadBytesBurst)
	lm.dir[1].ops.set(l.WriteIOPS, l.WriteIOPSBurst)
	lm.dir[1].bytes.set(l.WriteBytesPerSecond, l.WriteBytesBurst)
	return lm
}

// reserve takes one request of n bytes and returns its wait (<= 0: none).
// A direction without limits costs no clock read.
func (lm *limiter) reserve(write bool, n int64) time.Duration {
	dir := &lm.dir[0]
	if write {
		dir = &lm.dir[1]
	}
	ops, bytes := &dir.ops, &dir.bytes
	if ops.interval == 0 && bytes.interval == 0 {
		return 0
	}
	now := int64(time.Since(lm.base))
	d := ops.take(now, 1)
	if n > 0 {
		d = max(d, bytes.take(now, n))
	}
	return time.Duration(d)
}

// qosState is an Array's QoS: the limiter in force (nil: no limits, the
// only cost of a request then is the load of this pointer) and the
// throttle counters, which outlive limit changes.
type qosState struct {
	lim       atomic.Pointer[limiter]
	setMu     sync.Mutex // serialises SetLimits
	delayed   [2]atomic.Uint64
	delayNano [2]atomic.Int64
	delayByte [2]atomic.Uint64
}

// timers are reused by waiting requests, so a wait allocates nothing.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// SetLimits puts l in force at once, for the requests that arrive from now
// and for those waiting (they reserve again under l; SetLimits(Limits{})
// releases them all). The buckets of a new setting start full; setting the
// limits in force again changes nothing. Negative values are ErrInvalid,
// naming the field.
func (a *Array) SetLimits(l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	l = l.normalized()
	q := &a.qos
	q.setMu.Lock()
	defer q.setMu.Unlock()
	old := q.lim.Load()
	if old == nil && l.IsZero() || old != nil && old.limits == l {
		return nil
	}
	var lm *limiter
	if !l.IsZero() {
		lm = newLimiter(l)
	}
	q.lim.Store(lm)
	if old != nil {
		close(old.changed)
	}
	return nil
}

// Limits returns the limits in force, with the bursts they use.
func (a *Array) Limits() Limits {
	if lm := a.qos.lim.Load(); lm != nil {
		return lm.limits
	}
	return Limits{}
}

// limitRequest delays a frontend request of n bytes as the limits say: the hook
// at the top of ReadAt, WriteAt, WriteAtFUA, Discard and WriteZeroes. No
// limits: one atomic load.
func (a *Array) limitRequest(write bool, n int64) {
	if lm := a.qos.lim.Load(); lm != nil {
		a.limitUnder(lm, write, n)
	}
}

// limitUnder reserves a request under lm and waits if it must.
func (a *Array) limitUnder(lm *limiter, write bool, n int64) {
	if d := lm.reserve(write, n); d > 0 {
		a.waitLimit(lm, write, n, d)
	}
}

// waitLimit waits the delay d that lm gave a request, reserving again under
// the new limits when they change meanwhile, and counts the wait.
func (a *Array) waitLimit(lm *limiter, write bool, n int64, d time.Duration) {
	t0 := time.Now()
	for sleepOrChange(d, lm.changed) {
		if lm = a.qos.lim.Load(); lm == nil {
			break
		}
		if d = lm.reserve(write, n); d <= 0 {
			break
		}
	}
	k := 0
	if write {
		k = 1
	}
	a.qos.delayed[k].Add(1)
	a.qos.delayNano[k].Add(int64(time.Since(t0)))
	a.qos.delayByte[k].Add(uint64(n))
}

// sleepOrChange sleeps for d or until changed is closed, and reports the
// latter.
func sleepOrChange(d time.Duration, changed <-chan struct{}) bool {
	t := timers.Get().(*time.Timer)
	defer timers.Put(t)
	t.Reset(d)
	select {
	case <-t.C:
		return false
	case <-changed:
		t.Stop()
		return true
	}
}

// throttleStatus returns the limits in force and the throttle counters.
func (a *Array) throttleStatus() (Limits, ThrottleStatus) {
	q := &a.qos
	return a.Limits(), ThrottleStatus{
		ReadsDelayed:  q.delayed[0].Load(),
		WritesDelayed: q.delayed[1].Load(),
		ReadDelay:     time.Duration(q.delayNano[0].Load()),
		WriteDelay:    time.Duration(q.delayNano[1].Load()),

		ReadBytesDelayed:  q.delayByte[0].Load(),
		WriteBytesDelayed: q.delayByte[1].Load(),
	}
}

// paced is the Queue's hook at the top of Read and Write: it reports false
// when the request may go on at once (no limits: one atomic load; or under
// them), else it has taken the request (pace).
func (q *Queue) paced(op opKind, p []byte, off int64, fua bool, done Completer) bool {
	if lm := q.a.qos.lim.Load(); lm != nil {
		return q.pace(lm, op, p, off, fua, done)
	}
	return false
}

// pace reserves the request under lm; one that must wait gets a goroutine
// of its own that waits the delay and runs it on the synchronous path, as
// a fallback does, so the ring's other requests (reads while writes are
// limited, the requests behind it) go on meanwhile. Close waits for it.
func (q *Queue) pace(lm *limiter, op opKind, p []byte, off int64, fua bool, done Completer) bool {
	write, n := op != opRead, int64(len(p))
	d := lm.reserve(write, n)
	if d <= 0 {
		return false
	}
	q.slow.Add(1)
	go func() {
		defer q.slow.Done()
		q.a.waitLimit(lm, write, n, d)
		done.Complete(q.runSync(op, p, off, fua))
		q.batchDone()
	}()
	return true
}
