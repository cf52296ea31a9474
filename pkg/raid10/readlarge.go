package raid10

// Reads.
//
// A read within one chunk and smaller than splitReadMin goes straight to
// readPiece on the caller's goroutine: one member call on the copy the
// balancing picks (fewer requests in flight, then the nearer head).
//
// A larger read is cut into parts that run at once: one per chunk it
// touches, and a chunk part of at least splitReadMin whose two copies are
// both idle (no request in flight on either member) is halved, the first
// half read from the chunk's first copy and the second from its second.
// near-2 keeps a chunk's copies on neighbouring members, so a 1 MiB read
// over 512 KiB chunks on 4 members then reads from all 4 at once: the
// sequential read speed of md's far-2 layout, without far-2's long seeks
// on every write. When the members are busy (a deep queue of large reads
// spreads over every member already) a chunk part is not halved, and a
// large read costs md's member calls: one per chunk.
//
// Every part is a readPiece with its own bucket entry and its own fault
// handling: a part whose copy fails, has bad blocks there or was failed
// meanwhile falls back to the other copy (readSlow) like any read. A part
// enters its bucket only while it runs: no goroutine holds one bucket while
// it waits to enter another, which would deadlock with freeze (grow.go).
// The parts other than the last go to the array's workers through the
// preallocated requests (no goroutine and no allocation per read); when
// none is free a part runs on the caller's goroutine.

const (
	// splitReadMin is the smallest chunk part read half from each copy, and
	// the size from which a read within one chunk takes the parallel path.
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
	var parts [maxReadParts]readPart
	done := 0
	for done < len(p) {
		n, next := a.planRead(&parts, p, off, done)
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
// returns how many it made and how far into p they reach.
func (a *Array) planRead(parts *[maxReadParts]readPart, p []byte, off int64, done int) (int, int) {
	n := 0
	for done < len(p) && n < maxReadParts {
		aoff := off + int64(done)
		l := int(min(int64(len(p)-done), a.geo.chunk-aoff&(a.geo.chunk-1)))
		if l >= splitReadMin && n+2 <= maxReadParts && a.bothIdle(aoff) {
			h := l / 2 &^ (BlockSize - 1)
			parts[n] = readPart{p: p[done : done+h], aoff: aoff, want: 0}
			parts[n+1] = readPart{p: p[done+h : done+l], aoff: aoff + int64(h), want: 1}
			n += 2
		} else {
			parts[n] = readPart{p: p[done : done+l], aoff: aoff, want: copyAny}
			n++
		}
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
