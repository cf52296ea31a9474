package raid10

import (
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Member request deadline (Options.MemberTimeout).
//
// Detection costs the fast path one atomic load and two adds per member
// request: a request counts itself in its member's out[epoch mod 8] while
// it runs. A monitor advances the epoch every MemberTimeout/4; a count still
// non-zero in an epoch at least 5 ticks old means a request has run for at
// least 4 ticks, the deadline. The member is then failed as md fails a
// member whose device timed out: its ref is marked timed out (every later
// request to it fails at once), its dead channel is closed, and the failure
// is written to the other members' superblocks.
//
// Rescue: the request must complete from the other copy while the stuck
// call is still inside the member. So on members with device latency
// (moving average >= handoffLatency, i.e. real disks) the member calls are
// run by workers, and the submitter waits for the call or for the member's
// dead channel, whichever comes first. An abandoned read was made into a
// bounce buffer the worker owns, so a late completion never writes into
// the caller's memory; an abandoned write's late landing only reaches a
// member that is failed, whose bitmap bits stay set until its recovery
// rewrites the region (the sweeper clears nothing while a slot is not in
// sync), and the member cannot be added back while such a call is still
// outstanding (ErrBusy). On members that complete in memory the calls are
// made inline: a stuck one is detected and fails its member, but its own
// request waits for the call to return.
const epochRing = 8

// errTimedOut is the member error of a request that passed the deadline.
var errTimedOut = &wrapped{msg: "raid10: member request timed out", errno: syscall.EIO}

// errMemberGone is the member error of a request made to a member after it
// was failed.
var errMemberGone = &wrapped{msg: "raid10: member failed before the request reached it", errno: syscall.EIO}

// timeout is the deadline in force, 0 when disabled.
func (a *Array) timeout() time.Duration {
	return time.Duration(max(0, a.mtimeout.Load()))
}

// rescue reports whether requests to s are handed to workers so that a
// stuck call can be abandoned.
func (a *Array) rescue(s *slot) bool {
	return a.timeout() > 0 && s.wlat.Load() >= int64(handoffLatency)
}

// kill marks r dead: waiters abandon their calls to it, and calls that
// start later fail at once (refused).
func (r *memberRef) kill() {
	r.gone.Store(true)
	r.deadOnce.Do(func() { close(r.dead) })
}

// kill marks r dead (see memberRef.kill) and abandons its copies in
// flight on the Queues' rings.
func (a *Array) kill(r *memberRef) {
	r.kill()
	a.abandonRing(r)
}

// refused is the error of a member call that must not reach the member:
// it passed the deadline, or it was failed. Only the calls already inside
// a failed member may still reach its storage, and each of those is
// either waited for or counted as a zombie (abandon). Without this a call
// handed off before the failure but run after it (a write that loaded the
// ref before it was killed) reached the storage while an abandoned call to
// the same blocks was still inside it, and, not being waited for by
// anyone, was not ordered before the member's re-add either.
func (r *memberRef) refused() error {
	if r.timedOut.Load() {
		return errTimedOut
	}
	if r.gone.Load() {
		return errMemberGone
	}
	return nil
}

func newRef(m Member, uuid [16]byte) *memberRef {
	return &memberRef{m: m, uuid: uuid, dead: make(chan struct{})}
}

// deadlineMonitor advances the epoch and fails members with a request
// older than the deadline.
func (a *Array) deadlineMonitor() {
	defer a.bg.Done()
	tick := max(a.timeout()/4, time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		e := a.epoch.Add(1)
		for _, s := range a.slots {
			r := s.live()
			if r == nil || r.timedOut.Load() {
				continue
			}
			stuck := r.runFor(e, deadlineTicks)
			if stuck == 0 {
				// A stall waited for ends when nothing is in flight: a
				// request older than the ring is counted again when its
				// epoch comes round, as the same stall.
				if r.slowLast.Load() && r.idle() {
					r.slowLast.Store(false)
				}
				continue
			}
			if why := a.timeoutWait(s, e); why != "" {
				// The last in-sync copy of some chunk, or a stall its
				// partner shares: wait for it.
				if !r.slowLast.Swap(true) {
					s.slowLast.Add(1)
					klog.ErrorS(errTimedOut, "raid10: member passed the deadline: not failed, its requests wait",
						"array", a.logID(), "member", s.idx, "deadline", a.timeout(), "requests", stuck, "why", why)
				}
				continue
			}
			r.timedOut.Store(true)
			s.timeouts.Add(1)
			klog.ErrorS(errTimedOut, "raid10: member request passed the deadline, failing the member", "array", a.logID(), "member", s.idx, "deadline", a.timeout(), "requests", stuck)
			a.kill(r)
			// Not on this goroutine: the superblock writes may take a
			// while, and other members are watched meanwhile.
			a.fails.Add(1)
			go func() {
				defer a.fails.Done()
				a.memberFailed(s, r, "timeout", errTimedOut)
			}()
		}
	}
}

// Ages in monitor ticks (a quarter of the deadline each): a request that has
// run for deadlineTicks passed the deadline; a partner with a request that
// has run for partnerLateTicks (half the deadline) is late itself.
const (
	deadlineTicks    = 4
	partnerLateTicks = 2
)

// runFor counts r's requests that, at epoch e, have run for at least ticks
// monitor ticks: those counted in an epoch at least ticks+1 old (a request
// counted in epoch k started before the tick that began k+1).
func (r *memberRef) runFor(e int64, ticks int64) int64 {
	n := int64(0)
	for k := e - epochRing + 1; k <= e-ticks-1; k++ {
		if k >= 0 {
			n += r.out[k%epochRing].Load()
		}
	}
	return n
}

// idle reports whether no request to r is running.
func (r *memberRef) idle() bool {
	for i := range r.out {
		if r.out[i].Load() != 0 {
			return false
		}
	}
	return true
}

// timeoutWait says why member s, which has a request older than the
// deadline at epoch e, must not be failed for it, or "" when it may be: when
// the array is not serving (Create and Assemble refuse a hung member, the
// caller retries; Close must not wait for a hung disk), when s is not in
// sync, or when the other copy of each of its chunks is in sync, neither
// failing nor broken, and answering: none of its requests has run for half
// the deadline.
//
// Otherwise failing s would buy nothing and could cost data:
//   - "last copy": s holds the last good copy of some chunk, and failing it
//     for a slow answer would turn a stall into lost data: its ref would
//     refuse every later request, so every chunk it holds alone would fail
//     with EIO until the array is assembled again. The monitor waits for it
//     instead, as md waits for its last device (whose own timeout bounds the
//     wait; the NBD request timeout bounds it for the client).
//   - "partner late too": both copies of some chunk stall at once, which is
//     the host's stall or a path the disks share (a controller, a starved
//     guest), seldom two disks failing in the same quarter of the deadline.
//     Failing one would not serve its requests sooner (they wait for the
//     other copy) and would leave the array degraded once the stall ends: a
//     stall of every member failed half of them before (the diskfault
//     suite under a loaded host).
//
// It reads the slots without metaMu (the monitor must not wait for a
// holder of metaMu that waits for a stuck member): a partner failed by an
// I/O error at the same moment can still leave s broken, which
// memberFailedLocked decides under the lock.
func (a *Array) timeoutWait(s *slot, e int64) string {
	if !a.serving.Load() || a.closed.Load() || MemberState(s.state.Load()) != MemberInSync {
		return ""
	}
	late := false
	for _, other := range a.geo.partners(s.idx) {
		o := a.slots[other]
		if MemberState(o.state.Load()) != MemberInSync || o.failing.Load() || o.broken.Load() {
			return "last copy"
		}
		r := o.ref.Load()
		if r == nil || r.timedOut.Load() {
			return "last copy"
		}
		if r.runFor(e, partnerLateTicks) > 0 || r.slowLast.Load() {
			late = true
		}
	}
	if late {
		return "partner late too"
	}
	return ""
}

// handedOff runs one member call on a worker and waits for it or for the
// member to die. A read goes through a bounce buffer the worker owns. It
// reports ok=false when no preallocated request is free (the caller then
// makes the call itself).
func (a *Array) handedOff(s *slot, r *memberRef, op opKind, p []byte, off, length int64, fua bool) (err error, ok bool) {
	if err := r.refused(); err != nil {
		return err, true
	}
	req := a.reqs.pop()
	if req == nil {
		return nil, false
	}
	req.s, req.ref, req.op, req.p, req.off, req.length, req.fua = s, r, op, p, off, length, fua
	a.submit(req)
	return a.await(req), true
}

// rescuedIO is a read or write of a resync, recovery, scrub or read fix-up:
// handed off like foreground calls where the deadline can abandon it, so a
// member that hangs under a sync holds neither the chunk's barrier (and the
// foreground requests behind it) nor Close past the deadline.
func (a *Array) rescuedIO(s *slot, r *memberRef, op opKind, p []byte, off int64) error {
	if a.rescue(s) {
		if err, ok := a.handedOff(s, r, op, p, off, int64(len(p)), false); ok {
			return err
		}
	}
	if op == opRead {
		return a.memberRead(s, r, p, off)
	}
	return a.memberWrite(s, r, op, p, off, int64(len(p)), false)
}

// await waits for a handed-off call (or the death of its member) and
// recycles the request unless it was abandoned.
func (a *Array) await(req *wreq) error {
	ref := req.ref // the worker clears req.ref once it owns an abandoned req
	select {
	case <-req.done:
	case <-ref.dead:
		if a.abandon(&req.state, ref.m) {
			return errTimedOut
		}
		<-req.done
	}
	err := req.err
	if req.op == opRead && err == nil {
		copy(req.p, (*req.buf)[:len(req.p)])
	}
	a.recycle(req)
	return err
}

func (a *Array) recycle(req *wreq) {
	if req.buf != nil {
		putBounce(req.buf)
	}
	req.s, req.ref, req.p, req.err, req.buf = nil, nil, nil, nil, nil
	req.state.Store(reqPending)
	a.reqs.push(req)
}

// complete is the worker's end of a handed-off call.
func (a *Array) complete(req *wreq) {
	if req.state.CompareAndSwap(reqPending, reqDone) {
		req.done <- struct{}{}
		return
	}
	// Abandoned: the late call is over; the member may be added back.
	a.unzombie(req.ref.m)
	klog.InfoS("raid10: abandoned member request completed late", "member", req.s.idx, "err", req.err)
	a.recycle(req)
}

// zombieKey identifies the storage behind a member: extents of one base
// at one offset are the same storage whatever Member value wraps them.
func zombieKey(m Member) any {
	if e, ok := m.(*ExtentMember); ok {
		return extentKey{e.base, e.off}
	}
	return m
}

type extentKey struct {
	base Member
	off  int64
}

// Request states of a handed-off call.
const (
	reqPending int32 = iota
	reqDone
	reqAbandoned
)

// metaIO runs a metadata call (superblock or bitmap write, flush) to r
// under the deadline: it is counted like a data call, and when the
// deadline is in force it runs on its own goroutine so that a member that
// hangs cannot hold metaMu (and with it every state change and first write
// into a clean region) past the deadline: the caller gets errTimedOut when
// the member dies. Metadata calls are rare; the goroutine costs nothing on
// the data path. The buffer a call writes must not be reused by the caller.
func (a *Array) metaIO(r *memberRef, call func() error) error {
	if err := r.refused(); err != nil {
		return err
	}
	run := func() error {
		out := &r.out[a.epoch.Load()%epochRing]
		out.Add(1)
		defer out.Add(-1)
		return call()
	}
	if a.timeout() <= 0 {
		return run()
	}
	done := make(chan error, 1)
	var state atomic.Int32
	a.late.Add(1)
	go func() {
		defer a.late.Done()
		err := run()
		if state.CompareAndSwap(reqPending, reqDone) {
			done <- err
			return
		}
		a.unzombie(r.m)
	}()
	select {
	case err := <-done:
		return err
	case <-r.dead:
		if a.abandon(&state, r.m) {
			return errTimedOut
		}
		return <-done
	}
}

// abandon marks a call abandoned and counts it against its storage, or
// reports false if the call completed first. Under zombieMu, so the late
// completion's unzombie follows the count.
func (a *Array) abandon(state *atomic.Int32, m Member) bool {
	a.zombieMu.Lock()
	defer a.zombieMu.Unlock()
	if !state.CompareAndSwap(reqPending, reqAbandoned) {
		return false
	}
	a.zombies[zombieKey(m)]++
	return true
}

// unzombie is the late completion of an abandoned call to m.
func (a *Array) unzombie(m Member) {
	a.zombieMu.Lock()
	defer a.zombieMu.Unlock()
	k := zombieKey(m)
	if a.zombies[k]--; a.zombies[k] <= 0 {
		delete(a.zombies, k)
	}
}

// zombieCount is the number of abandoned calls to m's storage still running.
func (a *Array) zombieCount(m Member) int {
	a.zombieMu.Lock()
	defer a.zombieMu.Unlock()
	return a.zombies[zombieKey(m)]
}

// deadlineTimer returns a channel that receives once d has passed (nil,
// never, if d is not positive) and the function that stops its timer.
func deadlineTimer(d time.Duration) (<-chan time.Time, func()) {
	if d <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}
