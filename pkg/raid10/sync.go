package raid10

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// The sync daemon: resync of regions whose copies may differ, recovery of
// members that are not in sync, their progress and throttling. Scrubs are
// in scrub.go, the block-by-block healing of a range in heal.go.

func (a *Array) kickSync() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *Array) stopped() bool {
	select {
	case <-a.stop:
		return true
	default:
		return false
	}
}

// syncDaemon runs resync and recovery, one at a time, when kicked.
func (a *Array) syncDaemon() {
	defer a.bg.Done()
	for {
		select {
		case <-a.stop:
			return
		case <-a.kick:
		}
		a.syncRun.Lock()
		if a.resyncActive.Load() {
			a.runResync()
		}
		a.runRecovery()
		a.syncRun.Unlock()
	}
}

func (a *Array) beginProgress(kind SyncKind, total int64) {
	a.progMu.Lock()
	a.prog = SyncProgress{Kind: kind, Running: true, Total: total}
	a.progBase = 0
	a.syncStart = time.Now()
	a.lastFg = a.fgOps()
	a.progMu.Unlock()
}

func (a *Array) addProgress(n int64) {
	a.progMu.Lock()
	a.prog.Done += n
	a.progMu.Unlock()
}

func (a *Array) endProgress() {
	a.progMu.Lock()
	a.prog.Running = false
	a.progMu.Unlock()
}

func (a *Array) progress() SyncProgress {
	a.progMu.Lock()
	p := a.prog
	start := a.syncStart
	base := a.progBase
	a.progMu.Unlock()
	if p.Running {
		if el := time.Since(start).Seconds(); el > 0 {
			p.Rate = float64(p.Done-base) / el
		}
		if p.Rate > 0 {
			p.ETA = time.Duration(float64(p.Total-p.Done) / p.Rate * float64(time.Second))
		}
	}
	return p
}

func (a *Array) fgOps() uint64 {
	var n uint64
	for i := range a.buckets {
		n += a.buckets[i].rOps.Load() + a.buckets[i].wOps.Load()
	}
	return n
}

// throttle keeps the sync rate under its ceiling (Rates: SyncMax, or a
// scrub's ScrubMax) and, while foreground I/O
// is running, yields to it as long as the rate stays above SyncMin
// (md's sync_speed_max and sync_speed_min).
// Above the maximum it sleeps until the rate is down to it, in steps of at
// most 200 ms so that a stop is seen: a single capped sleep per chunk let a
// 512 KiB chunk through every 200 ms (2.5 MiB/s) whatever the maximum.
func (a *Array) throttle() {
	for slept := false; ; slept = true {
		done, el := a.syncDone()
		rate := float64(done) / max(el.Seconds(), 1e-6)
		mx, mn := a.syncCeiling()
		if mx > 0 && rate > float64(mx) {
			want := time.Duration(float64(done) / float64(mx) * float64(time.Second))
			a.sleep(min(want-el, 200*time.Millisecond))
			if a.stopped() {
				return
			}
			continue
		}
		if !slept {
			a.yield(done, el, rate, mn)
		}
		return
	}
}

// yield slows the sync towards the floor mn while foreground I/O runs.
func (a *Array) yield(done int64, el time.Duration, rate float64, mn int64) {
	if fg := a.fgOps(); fg != a.lastFg {
		// Foreground I/O since the last chunk: fall back towards the floor.
		a.lastFg = fg
		if mn > 0 && rate > float64(mn) {
			want := time.Duration(float64(done) / float64(mn) * float64(time.Second))
			a.sleep(min(want-el, 10*time.Millisecond))
		}
	}
}

// syncDone is the work the running sync has done (a resumed scrub's skipped
// part is not work done) and the time since it began.
func (a *Array) syncDone() (int64, time.Duration) {
	a.progMu.Lock()
	defer a.progMu.Unlock()
	return a.prog.Done - a.progBase, time.Since(a.syncStart)
}

func (a *Array) sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-a.stop:
		t.Stop()
	}
}

// chunkLen is the number of array bytes in chunk c (the last may be short).
func (a *Array) chunkLen(c int64) int64 {
	return min(a.geo.chunk, a.geo.size-c<<a.geo.chunkShift)
}

// runResync makes the two copies of every chunk in the regions that need
// it equal, copying the first copy over the second, and clears the regions'
// resync marks (the bitmap bits are then cleared lazily by the sweeper).
func (a *Array) runResync() {
	incomplete := map[int64]bool{}
	total := 0
	for {
		var regions []int64
		for r := int64(0); r < a.geo.regions; r++ {
			if a.regionNeedsResync(r) && !incomplete[r] {
				regions = append(regions, r)
			}
		}
		if len(regions) == 0 {
			break
		}
		total += len(regions)
		a.beginProgress(SyncResync, int64(len(regions))*a.geo.region)
		buf := AlignedBuffer(int(a.geo.chunk))
		per := a.geo.region / a.geo.chunk
		for _, r := range regions {
			done := true
			for c := r * per; c < min((r+1)*per, a.geo.chunks); c++ {
				if a.stopped() {
					a.endProgress()
					return
				}
				done = a.resyncChunk(c, buf) && done
				a.addProgress(a.geo.chunk)
				a.throttle()
			}
			if done {
				a.resyncNeed()[r>>6].And(^(uint64(1) << (r & 63)))
			} else {
				// A copy could not be written (a member that cannot be
				// failed): the region stays marked, so Close leaves the
				// array unclean and the next assembly resyncs it.
				incomplete[r] = true
			}
		}
		a.endProgress()
	}
	a.resyncActive.Store(false)
	klog.V(1).InfoS("raid10: resync done", "regions", total, "incomplete", len(incomplete))
}

// markResync makes region r's copies equal again in the background (a
// write that failed may have reached one copy only). Until then reads
// there use the first copy, so the block's value stays stable.
func (a *Array) markResync(r int64) {
	a.resyncNeed()[r>>6].Or(1 << (r & 63))
	a.resyncActive.Store(true)
	a.kickSync()
}

// resyncChunk makes both copies of chunk c equal; false if some copy could
// not be written.
//
// With one copy in sync and the other recovering, the in-sync copy is
// written over the recovering one (modeRecover), as the recovery does: a
// write that failed on the in-sync copy (its failure not recordable) may
// have reached only the recovering one, in a chunk its recovery had
// already copied. Left so, a recovery resumed past the chunk after a clean
// stop (its checkpoint says done, and nothing redoes dirty regions then)
// would promote the member with the chunk different
// (TestFailedWriteOnRecoveredChunk).
// Copying a chunk the recovery has not reached yet costs one chunk copy.
func (a *Array) resyncChunk(c int64, buf []byte) bool {
	bk := a.raise(c)
	defer a.lower(bk)
	d0, d1, _, _ := a.geo.mapChunk(c)
	s0, s1 := a.slots[d0], a.slots[d1]
	if s0.inSync() != nil && s1.inSync() != nil {
		_, ok := a.syncRange(c, 0, buf[:a.chunkLen(c)], modeResync, nil)
		return ok
	}
	if s0.inSync() == nil && s1.inSync() == nil {
		return true // no copy to make the other equal to
	}
	t := s0
	if s0.inSync() != nil {
		t = s1
	}
	if MemberState(t.state.Load()) != MemberRecovering {
		return true // one copy: nothing to make equal
	}
	if t.broken.Load() {
		// Failed but not recorded: it cannot be written now. The region
		// stays marked, so a stop is unclean and a resumed recovery
		// redoes the dirty regions.
		return false
	}
	_, ok := a.syncRange(c, 0, buf[:a.chunkLen(c)], modeRecover, map[*slot]*memberRef{t: t.ref.Load()})
	return ok
}

// checkpointEvery is how often a recovery records its progress in the
// targets' superblocks, so an interrupted one resumes there.
var checkpointEvery = 2 * time.Second

// runRecovery rebuilds every recovering slot: all chunks with a copy on it
// (full) or only those in regions the bitmap marks dirty (re-add), from
// where an interrupted recovery stopped. Writes that arrive meanwhile reach
// the recovering member directly; each chunk is copied under its bucket's
// barrier, so a copy never races a write. Every chunk is either copied or,
// where no copy can be read, recorded bad on the target; a target is
// promoted only when the whole list is done. Progress is checkpointed
// (target flushed, then its superblock's recovery offset).
func (a *Array) runRecovery() {
	for !a.stopped() {
		a.metaMu.Lock()
		var targets []*slot
		refs := map[*slot]*memberRef{}
		full, redoDirty := false, false
		from := a.geo.chunks
		for _, s := range a.slots {
			// A broken target (it failed but no member could record it)
			// is never rebuilt or promoted: it may have missed data.
			if MemberState(s.state.Load()) == MemberRecovering && !s.broken.Load() {
				targets = append(targets, s)
				refs[s] = s.ref.Load()
				full = full || s.fullSync
				redoDirty = redoDirty || s.redoDirty
				from = min(from, a.resumeChunk(s))
			}
		}
		a.metaMu.Unlock()
		if len(targets) == 0 {
			return
		}
		isTarget := func(d int) bool {
			_, ok := refs[a.slots[d]]
			return ok
		}
		dirty := make(map[int64]bool)
		for _, r := range a.bm.dirtyRegions() {
			dirty[r] = true
		}
		var chunks []int64
		for c := int64(0); c < a.geo.chunks; c++ {
			if d0, d1, _, _ := a.geo.mapChunk(c); !isTarget(d0) && !isTarget(d1) {
				continue
			}
			inDirty := dirty[c<<a.geo.chunkShift/a.geo.region]
			if (c >= from && (full || inDirty)) || (c < from && redoDirty && inDirty) {
				chunks = append(chunks, c)
			}
		}
		if from > 0 {
			klog.InfoS("raid10: recovery resumes", "fromChunk", from, "chunks", len(chunks), "redoDirty", redoDirty)
		}
		a.beginProgress(SyncRecovery, int64(len(chunks))*a.geo.chunk)
		buf := AlignedBuffer(int(a.geo.chunk))
		last := time.Now()
		for _, c := range chunks {
			if a.stopped() {
				a.endProgress()
				return
			}
			if time.Since(last) >= checkpointEvery && c >= from {
				a.checkpoint(targets, refs, c)
				last = time.Now()
			}
			a.recoverChunk(c, buf, refs)
			a.addProgress(a.geo.chunk)
			a.throttle()
		}
		a.metaMu.Lock()
		for _, s := range targets {
			if s.ref.Load() == refs[s] && MemberState(s.state.Load()) == MemberRecovering && !s.broken.Load() && !s.failing.Load() {
				if err := refs[s].m.Flush(); err != nil {
					a.memberFailedLocked(s, refs[s], "recovery flush", err)
					continue
				}
				s.state.Store(int32(MemberInSync))
				s.fullSync, s.redoDirty, s.recovered = false, false, 0
				klog.InfoS("raid10: recovery done", "member", s.idx, "chunks", len(chunks), "badBlocks", refs[s].bad.Load().blocks())
			}
		}
		a.writeSuperblocksLocked(true, false)
		a.metaMu.Unlock()
		a.endProgress()
	}
}

// resumeChunk is the first array chunk s's recovery has not done: every
// chunk with a copy on s in a device row below s.recovered is done.
// Caller holds metaMu.
func (a *Array) resumeChunk(s *slot) int64 {
	rows := s.recovered >> a.geo.chunkShift
	if rows <= 0 {
		return 0
	}
	return (rows*int64(a.geo.n) + int64(s.idx)) / nearCopies
}

// checkpoint records that every chunk before next is done on the targets:
// the targets are flushed, then their superblocks say how many device rows
// are rebuilt (rows whose chunk slots on the target all precede next).
func (a *Array) checkpoint(targets []*slot, refs map[*slot]*memberRef, next int64) {
	for _, s := range targets {
		if r := refs[s]; s.ref.Load() == r && MemberState(s.state.Load()) == MemberRecovering {
			if err := r.m.Flush(); err != nil {
				a.memberFailed(s, r, "recovery flush", err)
			}
		}
	}
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	n := int64(a.geo.n)
	changed := false
	for _, s := range targets {
		if s.ref.Load() != refs[s] || MemberState(s.state.Load()) != MemberRecovering {
			continue
		}
		// Rows r with slot r*n+idx < 2*next are done.
		rows := max(0, (2*next-int64(s.idx)+n-1)/n)
		if b := rows << a.geo.chunkShift; b > s.recovered {
			s.recovered = b
			changed = true
		}
	}
	if changed {
		a.writeSuperblocksLocked(false, false)
	}
}

func (a *Array) recoverChunk(c int64, buf []byte, refs map[*slot]*memberRef) {
	bk := a.raise(c)
	defer a.lower(bk)
	d0, d1, _, _ := a.geo.mapChunk(c)
	if a.slots[d0].inSync() == nil && a.slots[d1].inSync() == nil {
		for _, d := range []int{d0, d1} {
			if t, ok := refs[a.slots[d]]; ok {
				a.memberFailed(a.slots[d], t, "recovery", fmt.Errorf("no in-sync source for chunk %d", c))
			}
		}
		return
	}
	a.syncRange(c, 0, buf[:a.chunkLen(c)], modeRecover, refs)
}

// WaitSync blocks until no resync or recovery is pending or running (or
// ctx ends, or the array closes). A recovery that cannot proceed (no
// source) fails its member, so WaitSync does return.
func (a *Array) WaitSync(ctx context.Context) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		busy := a.resyncActive.Load()
		for _, s := range a.slots {
			if MemberState(s.state.Load()) == MemberRecovering && !s.broken.Load() {
				busy = true // a broken one cannot progress: not waited for
			}
		}
		if !busy {
			return nil
		}
		if a.closed.Load() {
			return ErrClosed
		}
		a.kickSync()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// resyncNeed returns the resync bits (one per region).
func (a *Array) resyncNeed() []atomic.Uint64 { return *a.resyncNeedP.Load() }

func (a *Array) regionNeedsResync(r int64) bool {
	return a.resyncNeed()[r>>6].Load()&(1<<(r&63)) != 0
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
