package raid10

// Array state and the Status snapshot.

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
	st.Events = a.events.Load() // not under metaMu: its holder may wait for a stalled member
	for i := range a.buckets {
		b := &a.buckets[i]
		st.ReadOps += b.rOps.Load()
		st.WriteOps += b.wOps.Load()
		st.ReadBytes += b.rBytes.Load()
		st.WriteBytes += b.wBytes.Load()
	}
	for _, s := range a.slots {
		ms := MemberStatus{
			Slot:         s.idx,
			State:        MemberState(s.state.Load()),
			ReadErrors:   s.readErrs.Load(),
			WriteErrors:  s.writeErrs.Load(),
			ReadOps:      s.readOps.Load(),
			WriteOps:     s.writeOps.Load(),
			ReadBytes:    s.readBytes.Load(),
			WriteBytes:   s.wrBytes.Load(),
			InFlight:     s.inflight.Load(),
			TimedOut:     s.timeouts.Load(),
			SlowLastCopy: s.slowLast.Load(),
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
	st.Limits, st.Throttle = a.throttleStatus()
	return st
}
