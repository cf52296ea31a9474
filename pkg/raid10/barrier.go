package raid10

import (
	"sync/atomic"
	"time"
)

// Barrier buckets: a request enters the bucket of its chunk; a sync
// operation or a read-error fix raises the bucket's barrier and waits for
// the requests inside to drain.

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

// tryEnter is enter when no barrier is raised on chunk c's bucket; with one
// raised (or the array closed) it admits nothing and reports false.
func (a *Array) tryEnter(c int64) (*bucket, bool) {
	bk := &a.buckets[c&bucketMask]
	bk.pending.Add(1)
	if bk.barrier.Load() == 0 && !a.closed.Load() {
		return bk, true
	}
	a.exit(bk)
	return nil, false
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

// freeze raises the barrier of every bucket and waits until no request is
// inside any; thaw lowers them. Like raise, it holds raiseMu throughout.
func (a *Array) freeze() {
	a.raiseMu.Lock()
	for i := range a.buckets {
		a.buckets[i].barrier.Add(1)
	}
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for i := range a.buckets {
		for a.buckets[i].pending.Load() != 0 {
			select {
			case <-a.syncWake:
			case <-t.C:
				t.Reset(time.Millisecond)
			}
		}
	}
}

func (a *Array) thaw() {
	for i := range a.buckets {
		a.buckets[i].barrier.Add(-1)
	}
	a.raiseMu.Unlock()
	if a.barrierWaiters.Load() > 0 {
		a.barrierMu.Lock()
		a.barrierCond.Broadcast()
		a.barrierMu.Unlock()
	}
}
