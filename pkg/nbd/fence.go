package nbd

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The kernel's nbd driver, when a request times out, shuts that socket down and re-sends the
// request on another connection. The server may then run a write twice: the original, still
// in the backend or still queued, and the re-sent copy. That is harmless unless the original
// lands after a newer write to the same blocks that was acknowledged (the newer write can
// only come after the copy was acknowledged). Two rules forbid it:
//
//   - A connection whose peer is gone starts nothing more (conn.end): the requests it read
//     and had not started are dropped, unanswered. Those in the backend finish unanswered
//     (orphans).
//   - The fence: a modifying request (WRITE, TRIM, WRITE_ZEROES) that overlaps a fenced one
//     that arrived before it waits before it starts, so it lands after it. A modifying
//     request is fenced once it has been in flight for Options.SlowWrite (the guard
//     goroutine registers it, well before a client could time it out), or when it is
//     orphaned. So the re-sent copy, and everything after it, waits for the original even
//     if the server has not yet seen the end of the original's connection.
//
// Reads and flushes never wait: a read that overlaps a fenced write overlaps a write not yet
// acknowledged (or its copy), and may return either data; a flush makes durable what has
// completed. Requests wait only for fenced requests that arrived before them, so no two ever
// wait for each other. Waiting for an overlapping write that is still in flight is always
// allowed: the protocol orders no two requests in flight together.
//
// The healthy path pays one atomic load per request (fence.n) and a few compare-and-swaps on
// the request's slot; everything else runs only while fenced requests exist, under fence.mu,
// or in the guard, which ticks only while modifying requests are in flight.
type fence struct {
	n      atomic.Int32 // requests registered: the only field a healthy request reads
	mu     sync.Mutex
	cond   sync.Cond  // broadcast when a request leaves the fence or a waiting one is orphaned
	fenced []*request // under mu
}

// States of a request slot (request.state): a base state, plus slotFenced while the request
// is registered in its export's fence. A slot goes idle -> queued (decoded) -> waiting
// (started; in the fence if it must wait) -> running (in the backend) -> idle (replied).
// conn.end moves queued slots to dropped and waiting or running ones to orphan; whoever
// holds such a slot recycles it without a reply.
const (
	slotIdle uint32 = iota
	slotQueued
	slotWaiting
	slotRunning
	slotDropped
	slotOrphan

	slotBase   uint32 = 7
	slotFenced uint32 = 8
)

// move changes r's base state from one to another, keeping slotFenced. It reports whether r
// was in from, and whether it is fenced.
func (r *request) move(from, to uint32) (moved, fenced bool) {
	for {
		s := r.state.Load()
		if s&slotBase != from {
			return false, s&slotFenced != 0
		}
		if r.state.CompareAndSwap(s, to|s&slotFenced) {
			return true, s&slotFenced != 0
		}
	}
}

// modifies reports whether r changes data, and so is ordered by the fence.
func (r *request) modifies() bool {
	return r.cmd == CmdWrite || r.cmd == CmdTrim || r.cmd == CmdWriteZeroes
}

// overlaps reports whether the byte ranges of r and o intersect.
func (r *request) overlaps(o *request) bool {
	return r.off < o.off+uint64(o.length) && o.off < r.off+uint64(r.length)
}

// addLocked registers r, unless it is registered already; r's base state must be one the
// caller saw. Under mu.
func (f *fence) addLocked(r *request) {
	for {
		s := r.state.Load()
		if s&slotFenced != 0 {
			return
		}
		if r.state.CompareAndSwap(s, s|slotFenced) {
			break
		}
	}
	f.fenced = append(f.fenced, r)
	f.n.Add(1)
}

// removeLocked unregisters r if it is registered, and wakes the waiters. Under mu.
func (f *fence) removeLocked(r *request) {
	for {
		s := r.state.Load()
		if s&slotFenced == 0 {
			return
		}
		if r.state.CompareAndSwap(s, s&^slotFenced) {
			break
		}
	}
	for i, o := range f.fenced {
		if o == r {
			last := len(f.fenced) - 1
			f.fenced[i] = f.fenced[last]
			f.fenced[last] = nil
			f.fenced = f.fenced[:last]
			break
		}
	}
	f.n.Add(-1)
	f.cond.Broadcast()
}

// release unregisters r, which has finished or will not run.
func (f *fence) release(r *request) {
	f.mu.Lock()
	f.removeLocked(r)
	f.mu.Unlock()
}

// wait blocks r, a modifying request in state waiting, while a fenced request that arrived
// before it and overlaps it has not finished. It returns early if r is orphaned meanwhile.
func (f *fence) wait(r *request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for r.state.Load()&slotBase == slotWaiting && f.blockedLocked(r) {
		f.cond.Wait()
	}
}

func (f *fence) blockedLocked(r *request) bool {
	for _, o := range f.fenced {
		if o != r && o.start < r.start && r.overlaps(o) {
			return true
		}
	}
	return false
}

// end is called once the reader found the peer gone. Requests read and not started are
// dropped: nobody is left to answer, and the kernel re-sends them elsewhere. Requests
// started become orphans: those running finish unanswered, the modifying ones fenced until
// they do; those waiting in the fence stop waiting and never run. It returns how many
// requests it dropped and orphaned, and describes the first few orphans that were running
// (what a stuck backend request was, for the log).
func (c *conn) end() (dropped, orphaned int, running []string) {
	f := &c.exp.fence
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range c.slots {
		r := &c.slots[i]
		if ok, fenced := r.move(slotQueued, slotDropped); ok {
			dropped++
			if fenced {
				f.removeLocked(r)
			}
			continue
		}
		if ok, _ := r.move(slotWaiting, slotOrphan); ok {
			orphaned++
			continue
		}
		if ok, _ := r.move(slotRunning, slotOrphan); ok {
			orphaned++
			if r.modifies() {
				f.addLocked(r)
			}
			if len(running) < maxOrphansLogged {
				running = append(running, r.describe())
			}
		}
	}
	if orphaned > 0 {
		f.cond.Broadcast() // a request waiting in the fence stops waiting
	}
	return dropped, orphaned, running
}

// maxOrphansLogged bounds the running orphans end describes.
const maxOrphansLogged = 4

// describe names a request by command, range and age, e.g. "cmd 1 [4096+4096) for 12.5s".
func (r *request) describe() string {
	return fmt.Sprintf("cmd %d [%d+%d) for %s", r.cmd, r.off, r.length, (time.Since(epoch) - r.start).Round(time.Millisecond))
}

// guard starts the guard unless it runs. The reader calls it for each modifying request.
func (s *Server) guard() {
	if s.guarding.Load() || !s.guarding.CompareAndSwap(false, true) {
		return
	}
	go s.guardLoop()
}

// guardIdle is how many ticks without a modifying request in flight stop the guard.
const guardIdle = 8

// guardLoop fences every modifying request in flight for Options.SlowWrite or more, every
// quarter of it, until no modifying request has been in flight for guardIdle ticks.
func (s *Server) guardLoop() {
	t := time.NewTicker(s.opts.SlowWrite / 4)
	defer t.Stop()
	idle := 0
	for range t.C {
		if s.fenceSlow() {
			idle = 0
			continue
		}
		if idle++; idle < guardIdle {
			continue
		}
		// Stop, then look once more: a reader that decoded a request before this store
		// either is seen by this scan or starts a new guard.
		s.guarding.Store(false)
		if !s.fenceSlow() || !s.guarding.CompareAndSwap(false, true) {
			return
		}
		idle = 0
	}
}

// fenceSlow registers the modifying requests queued, waiting or running for SlowWrite or
// more, and reports whether any modifying request is in flight.
func (s *Server) fenceSlow() bool {
	now := time.Since(epoch)
	busy := false
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.counted == nil { // not transmitting yet; c.counted and c.slots are set under s.mu
			continue
		}
		f := &c.counted.fence
		for i := range c.slots {
			r := &c.slots[i]
			st := r.state.Load()
			switch st & slotBase {
			case slotQueued, slotWaiting, slotRunning:
			default:
				continue
			}
			// The other fields belong to the goroutine that holds the slot; since is the
			// decode time of a modifying request, 0 for the others.
			since := time.Duration(r.since.Load())
			if since == 0 {
				continue
			}
			busy = true
			if st&slotFenced != 0 || now-since < s.opts.SlowWrite {
				continue
			}
			f.mu.Lock()
			if b := r.state.Load() & slotBase; b == slotQueued || b == slotWaiting || b == slotRunning {
				f.addLocked(r)
			}
			f.mu.Unlock()
		}
	}
	return busy
}
