package raid10

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The fault matrix's restarts with a fault kept across them (see
// TestFaultMatrix).

// Faults kept across a restart: the array is assembled while a member is
// still unreadable over a range, slow, or gone (assembled without it, as
// the pool does with a disk it cannot use, then re-added), or while one
// fails during the assembly (write or read errors counted from there) or
// the resync or recovery it resumes (gone, or hung past the deadline, a
// few milliseconds in).
const (
	fkRestartUnreadable = "restart:unreadable"
	fkRestartSlow       = "restart:latency"
	fkRestartGone       = "restart:gone"
	fkRestartWriteErr   = "restart:write-eio"
	fkRestartReadErr    = "restart:read-eio"
	fkRestartDisappear  = "restart:disappear"
	fkRestartStall      = "restart:stall"
)

var restartFaults = []string{fkRestartUnreadable, fkRestartSlow, fkRestartGone, fkRestartWriteErr, fkRestartReadErr, fkRestartDisappear, fkRestartStall}

// restartFaultless weighs the rounds whose restart is calm (the draw is
// over len(restartFaults)+restartFaultless): about one in three.
const restartFaultless = 3

type restartEnv struct {
	fs           []*FaultyMember
	arr          []Member // the member fs[k] injects faults into, as the array holds it
	ms           []Member
	queue        *queueCounts // set: the verification reads go through a Queue
	opts         Options
	geo          *geometry
	model        []blockHistory
	crashed      bool
	poisonMember func(d int, off, length int64) // EIO allowed to the end
	poisoned     func(b int64) bool
	wrong        *atomic.Int64
	tot          *matrixTotals
}

// restartFaulted assembles the members with a fault of the given kind on
// one of them, waits for the resync or recovery, reads every block (wrong
// data fails; EIO only for a block a fault may have left without a good
// copy, one a failed write left undefined, or one whose in-sync copies are
// all past their deadline), and closes the array with every fault
// cleared, for the calm assembly that follows.
func restartFaulted(t *testing.T, rng *rand.Rand, kind string, e restartEnv) {
	n := len(e.fs)
	i := rng.IntN(n)
	f := e.fs[i]
	geo := e.geo
	ms := append([]Member(nil), e.ms...)
	// A device that fails as a whole (gone, hung, every read failing)
	// makes its blocks unavailable here, never lost: nothing may be
	// recorded bad for it, so the calm assembly after it reads them all.
	// Media errors and failed writes may leave blocks lost for good.
	var localMu sync.Mutex
	local := map[int64]bool{}
	unavailable := func(d int) {
		localMu.Lock()
		defer localMu.Unlock()
		for mb := geo.dataOffset / BlockSize; mb < (geo.dataOffset+geo.dataSize)/BlockSize; mb++ {
			if b := arrayBlockOf(geo, d, mb); b >= 0 && b < int64(len(e.model)) {
				local[b] = true
			}
		}
	}
	poisoned := func(b int64) bool {
		localMu.Lock()
		defer localMu.Unlock()
		return local[b] || e.poisoned(b)
	}
	switch kind {
	case fkRestartUnreadable:
		off := geo.dataOffset + rng.Int64N(geo.dataSize/BlockSize)*BlockSize
		l := min(int64(1+rng.IntN(64))*BlockSize, geo.dataOffset+geo.dataSize-off)
		e.poisonMember(i, off, l)
		f.FailRange(off, l, true, false)
	case fkRestartSlow:
		f.SetLatency(time.Duration(500+rng.IntN(2500)) * time.Microsecond)
	case fkRestartGone:
		// Only where another member carries the freshest superblock: an
		// assembly without the one that knows of a later failure would
		// trust a stale member, as md's would (the pool never leaves out
		// a disk it can read).
		var top uint64
		events := make([]uint64, n)
		for k, g := range e.fs {
			if sb, err := readSuperblock(g); err == nil {
				events[k] = sb.events
				top = max(top, sb.events)
			}
		}
		informed := false
		for k := range e.fs {
			if k != i && events[k] == top {
				informed = true
			}
		}
		if !informed {
			t.Logf("restart fault %s: member %d alone has the freshest superblock; not left out", kind, i)
			return
		}
		unavailable(i)
		f.Disappear()
		for k, m := range ms {
			if m == e.arr[i] {
				ms[k] = nil
			}
		}
	case fkRestartWriteErr:
		e.poisonMember(i, geo.dataOffset, geo.dataSize)
		f.FailWritesAfter(int64(rng.IntN(8)))
	case fkRestartReadErr:
		// Past the superblock and bitmap reads of the assembly itself,
		// which refuses a member it cannot read.
		unavailable(i)
		f.FailReadsAfter(1 + geo.bmBytes/sbSize + int64(rng.IntN(30)))
	}
	defer func() {
		for _, g := range e.fs {
			g.ClearFaults()
			g.Unstall()
			g.Reappear()
			g.SetLatency(0)
		}
	}()
	start := time.Now()
	defer func() {
		t.Logf("restart fault %s on member %d: %v", kind, i, time.Since(start).Round(time.Millisecond))
	}()
	ropts := e.opts
	ropts.SyncRateMax, ropts.SyncRateMin = -1, 1<<40 // the timed faults hit the syncs in their first milliseconds
	b, err := Assemble(ms, AssembleOptions{Options: ropts})
	if err != nil {
		if errors.Is(err, ErrTooFewMembers) {
			// A member that failed while assembling held the last in-sync
			// copy of some chunk: nothing is started.
			t.Logf("restart fault %s on member %d: assembly refused: %v", kind, i, err)
			return
		}
		t.Fatalf("assemble with %s on member %d: %v", kind, i, err)
	}
	var timed sync.WaitGroup
	if kind == fkRestartDisappear || kind == fkRestartStall {
		unavailable(i)
		delay := time.Duration(rng.IntN(20)) * time.Millisecond
		hold := e.opts.MemberTimeout * time.Duration(2+rng.IntN(2))
		timed.Add(1)
		go func() {
			defer timed.Done()
			time.Sleep(delay)
			if kind == fkRestartDisappear {
				f.Disappear()
				return
			}
			f.Stall()
			time.Sleep(hold)
			f.Unstall()
		}()
	}
	verify := func(when string) {
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.WaitSync(wctx); err != nil {
			t.Errorf("restart fault %s on member %d: %s: the sync did not end: %v; status %+v", kind, i, when, err, b.Status())
		}
		available := func(d int) bool {
			r := b.slots[d].inSync()
			return r != nil && !r.timedOut.Load()
		}
		var eio int64
		readAllBlocks(t, b, e.queue, func(blk int64, p []byte, err error) {
			if err != nil {
				d0, d1, _, _ := b.geo.mapChunk(blk * BlockSize >> b.geo.chunkShift)
				if !errors.Is(err, syscall.EIO) || !e.model[blk].indet && !poisoned(blk) && (available(d0) || available(d1)) {
					t.Errorf("restart fault %s on member %d: %s: block %d: %v (it has a good copy); status %+v", kind, i, when, blk, err, b.Status())
				}
				eio++
				return
			}
			if !e.model[blk].matches(p, e.crashed) {
				e.wrong.Add(1)
				t.Errorf("restart fault %s on member %d: %s: block %d: wrong data: it holds %s", kind, i, when, blk, e.model[blk].explain(p))
			}
		})
		t.Logf("restart fault %s on member %d: %s: state %v, EIO blocks %d", kind, i, when, b.State(), eio)
	}
	verify("after assembly")
	if kind == fkRestartGone {
		f.Reappear()
		if _, err := b.AddMember(e.arr[i]); err != nil {
			t.Errorf("re-adding member %d after the restart: %v", i, err)
		} else {
			verify("after its re-add")
		}
	}
	timed.Wait()
	if err := b.Close(); err != nil {
		t.Logf("close after the faulted restart: %v", err)
	}
	b.workers.Wait()
	b.late.Wait()
	b.fails.Wait()
	e.tot.mu.Lock()
	e.tot.restarts++
	e.tot.mu.Unlock()
}
