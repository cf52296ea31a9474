package nbd

import (
	"sync"
	"sync/atomic"
)

// A connection whose peer is gone (the kernel gave up on the socket after a request timeout,
// or the client died) answers nothing more: the requests it read and had not started are
// dropped (conn.end), and those already in the backend finish unanswered. Such a request is
// an orphan. The kernel re-sends every unanswered request on another connection, so an
// orphan write may still land after its re-sent copy completed and after a newer write to
// the same blocks was acknowledged, silently bringing the old data back. The fence forbids
// that: while an orphan that modifies data (WRITE, TRIM, WRITE_ZEROES) runs, a modifying
// request of the export that overlaps it waits before it starts, so it lands after the
// orphan. Reads and flushes never wait: a read that overlaps an orphan overlaps an
// unacknowledged write (the orphan's re-sent copy), and may see either data.
//
// The healthy path pays one atomic load per request (fence.n); everything else happens
// only while orphans exist, under fence.mu.
type fence struct {
	n       atomic.Int32 // modifying orphans registered: the only field a healthy request reads
	mu      sync.Mutex
	cond    sync.Cond  // broadcast when an orphan is released or a waiting request is orphaned
	orphans []*request // under mu
}

// States of a request slot (request.state). A slot goes idle -> queued (decoded) -> running
// (started: in the fence or the backend) -> idle (replied). conn.end moves queued slots to
// dropped and running ones to orphan; whoever holds such a slot recycles it without a reply.
const (
	slotIdle uint32 = iota
	slotQueued
	slotRunning
	slotDropped
	slotOrphan
)

// modifies reports whether r changes data, and so orders against orphans.
func (r *request) modifies() bool {
	return r.cmd == CmdWrite || r.cmd == CmdTrim || r.cmd == CmdWriteZeroes
}

// overlaps reports whether the byte ranges of r and o intersect.
func (r *request) overlaps(o *request) bool {
	return r.off < o.off+uint64(o.length) && o.off < r.off+uint64(r.length)
}

// addLocked registers r, just orphaned, if it modifies data. Under mu.
func (f *fence) addLocked(r *request) {
	if !r.modifies() {
		return
	}
	r.fenced = true
	f.orphans = append(f.orphans, r)
	f.n.Add(1)
}

// release unregisters r, an orphan that has finished, and wakes the requests waiting for it.
func (f *fence) release(r *request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !r.fenced {
		return
	}
	r.fenced = false
	for i, o := range f.orphans {
		if o == r {
			last := len(f.orphans) - 1
			f.orphans[i] = f.orphans[last]
			f.orphans[last] = nil
			f.orphans = f.orphans[:last]
			break
		}
	}
	f.n.Add(-1)
	f.cond.Broadcast()
}

// wait blocks r, a modifying request that has started, while an orphan overlapping it runs.
// It returns early if r itself is orphaned meanwhile (its peer left: it will not run), so
// that two orphans never wait for each other.
func (f *fence) wait(r *request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for r.state.Load() == slotRunning && f.blockedLocked(r) {
		f.cond.Wait()
	}
}

func (f *fence) blockedLocked(r *request) bool {
	for _, o := range f.orphans {
		if o != r && r.overlaps(o) {
			return true
		}
	}
	return false
}

// end is called once the reader found the peer gone. Requests read and not started are
// dropped: nobody is left to answer, and the kernel re-sends them elsewhere. Requests
// running become orphans, and the modifying ones fence the export's other connections until
// they finish. It returns how many requests it dropped and orphaned.
func (c *conn) end() (dropped, orphaned int) {
	f := &c.exp.fence
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range c.slots {
		r := &c.slots[i]
		if r.state.CompareAndSwap(slotQueued, slotDropped) {
			dropped++
			continue
		}
		if r.state.CompareAndSwap(slotRunning, slotOrphan) {
			orphaned++
			f.addLocked(r)
		}
	}
	if orphaned > 0 {
		f.cond.Broadcast() // an orphan waiting in the fence stops waiting
	}
	return dropped, orphaned
}
