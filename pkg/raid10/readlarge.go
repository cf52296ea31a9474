package raid10

// Reads.
//
// A read within one chunk and smaller than splitReadMin goes straight to
// readPiece on the caller's goroutine: one member call on the copy the
// balancing picks (fewer requests in flight, then the nearer head).
//
// A larger read runs as parts at once, and a stream of large reads reads
// from every member, as md's far-2 layout does (far-2's first copies are a
// raid0 stripe over all members), without far-2's long seeks on every
// write. near-2 keeps a chunk's copies on neighbouring members:
//
//   - a read over several chunks is one part per chunk, each read whole
//     from the copy its row of chunks takes (row mod 2: with 4 members,
//     chunks 0 and 1 from members 0 and 2, chunks 2 and 3 from members 1
//     and 3). The parts run at once, and a stream's consecutive reads
//     alternate between the copies: every member serves it, at md's cost
//     of one member call per chunk.
//   - a read of at least splitReadMin within one chunk, alone on the array
//     (no other large read in flight) and with both copies idle, is halved:
//     the first half from the chunk's first copy, the second half from its
//     second, so a single read at queue depth 1 still uses both.
//
// Every part is a readPiece with its own bucket entry and its own fault
// handling: a part whose copy fails, has bad blocks there or was failed
// meanwhile falls back to the other copy (readSlow) like any read. A part
// enters its bucket only while it runs: no goroutine holds one bucket while
// it waits to enter another, which would deadlock with freeze (grow.go).
// The parts other than the last go to the array's workers through the
// preallocated requests (no goroutine and no allocation per read); when
// none is free a part runs on the caller's goroutine. A part on a worker
// may wait there for a raised barrier whose raiser waits for a member call
// it handed off: that call has a worker of its own (submit), never one of
// the waiting parts' (TestHandOffWhileWorkersWaitOnBarrier).

const (
	// splitReadMin is the smallest read within one chunk that is read half
	// from each copy (and takes the parallel path).
	splitReadMin = 128 << 10
	// maxReadParts bounds the parts handed off at once (a fixed array on the
	// stack); a longer read runs in rounds of this many.
	maxReadParts = 16
	// copyAny lets readPiece pick the copy.
	copyAny = -1
)

// ReadAt reads len(p) bytes at off. off and len(p) must be multiples of
// BlockSize. A read error on one copy is served from the other copy, which
// is then written back over the bad one.
func (a *Array) ReadAt(p []byte, off int64) (int, error) {
	a.limitRequest(false, int64(len(p)))
	return a.read(p, off, false)
}

// read is ReadAt; raw reads reach the reserved tail and skip the hydrate
// hook (the copy's own I/O).
func (a *Array) read(p []byte, off int64, raw bool) (int, error) {
	if err := a.check(off, int64(len(p)), raw); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !raw {
		// A copy target hydrates the range here, on the caller's goroutine,
		// before parts go to the workers: a worker never waits for a copy
		// (whose own writes may need a worker). readPiece checks again.
		if err := a.hydrateRange(off, int64(len(p))); err != nil {
			return 0, err
		}
	}
	if len(p) < splitReadMin && off&(a.geo.chunk-1)+int64(len(p)) <= a.geo.chunk {
		if err := a.readPiece(p, off, copyAny, raw); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	// Close waits for slowOps: it does not close the workers' channel under
	// the parts being handed off.
	a.slowOps.Add(1)
	defer a.slowOps.Add(-1)
	if a.closed.Load() {
		return 0, ErrClosed
	}
	alone := a.largeReads.Add(1) == 1
	defer a.largeReads.Add(-1)
	var parts [maxReadParts]readPart
	done := 0
	for done < len(p) {
		n, next := a.planRead(&parts, p, off, done, alone)
		if k, err := a.runParts(parts[:n], raw); err != nil {
			return done + k, err
		}
		done = next
	}
	return done, nil
}

// readPart is one member-sized piece of a large read.
type readPart struct {
	p    []byte
	aoff int64
	want int
}

// planRead fills parts with the parts of p[done:] (at most maxReadParts) and
// returns how many it made and how far into p they reach. alone says that no
// other large read is in flight.
func (a *Array) planRead(parts *[maxReadParts]readPart, p []byte, off int64, done int, alone bool) (int, int) {
	if l := len(p); done == 0 && off&(a.geo.chunk-1)+int64(l) <= a.geo.chunk {
		// Within one chunk.
		if alone && l >= splitReadMin && a.bothIdle(off) {
			h := l / 2 &^ (BlockSize - 1)
			parts[0] = readPart{p: p[:h], aoff: off, want: 0}
			parts[1] = readPart{p: p[h:], aoff: off + int64(h), want: 1}
			return 2, l
		}
		parts[0] = readPart{p: p, aoff: off, want: copyAny}
		return 1, l
	}
	n := 0
	for done < len(p) && n < maxReadParts {
		aoff := off + int64(done)
		l := int(min(int64(len(p)-done), a.geo.chunk-aoff&(a.geo.chunk-1)))
		// The copy of the chunk's row: device slot 2c is in row 2c/n.
		row := (aoff >> a.geo.chunkShift) * nearCopies / int64(a.geo.n)
		parts[n] = readPart{p: p[done : done+l], aoff: aoff, want: int(row & 1)}
		n++
		done += l
	}
	return n, done
}

// bothIdle reports whether both copies of the chunk at aoff are in sync and
// have no request in flight: the only case where halving a part is worth
// its second member call.
func (a *Array) bothIdle(aoff int64) bool {
	d0, d1, _, _ := a.geo.mapChunk(aoff >> a.geo.chunkShift)
	s0, s1 := a.slots[d0], a.slots[d1]
	return s0.inSync() != nil && s1.inSync() != nil && s0.inflight.Load()+s1.inflight.Load() == 0
}

// runParts runs the parts at once and waits for all of them. On an error it
// returns the bytes read before the first part that failed.
func (a *Array) runParts(parts []readPart, raw bool) (int, error) {
	var reqs [maxReadParts]*wreq
	last := len(parts) - 1
	for i := range parts[:last] {
		req := a.reqs.pop()
		if req == nil {
			break // the rest run here, in turn
		}
		req.op, req.p, req.off, req.want, req.raw = opReadPiece, parts[i].p, parts[i].aoff, int8(parts[i].want), raw
		a.submit(req)
		reqs[i] = req
	}
	var errs [maxReadParts]error
	for i := range parts {
		if reqs[i] == nil {
			errs[i] = a.readPiece(parts[i].p, parts[i].aoff, parts[i].want, raw)
		}
	}
	for i := range parts {
		if req := reqs[i]; req != nil {
			<-req.done
			errs[i] = req.err
			a.recycle(req)
		}
	}
	done := 0
	for i := range parts {
		if errs[i] != nil {
			return done, errs[i]
		}
		done += len(parts[i].p)
	}
	return done, nil
}
