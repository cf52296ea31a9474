package nbd

import (
	"fmt"
	"time"
)

// LatencyBounds are the upper bounds of the latency buckets of OpStats, from 50µs (a
// request served from memory) to 10s (a disk about to time out).
var LatencyBounds = [...]time.Duration{
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 10 * time.Second,
}

// OpStats counts the replies to one kind of request of an export.
type OpStats struct {
	// Requests is the number of requests replied to, Errors of those with an error reply.
	Requests, Errors uint64
	// Bytes is the length of the successful ones: the payload of reads and writes, the range
	// of trims and zeroes.
	Bytes uint64
	// Queued is the number of requests served through the backend's asynchronous queue
	// (conn_queue.go) rather than a blocking call.
	Queued uint64
	// Latency counts the requests by the time from decoding the request to writing its
	// reply: Latency[i] those within LatencyBounds[i] (and above the bound before), the last
	// element those above every bound. LatencySum is the sum of the times.
	Latency    [len(LatencyBounds) + 1]uint64
	LatencySum time.Duration
}

// Stats counts the requests of an export, by kind, over every connection it has had.
type Stats struct {
	Read, Write, Flush, Trim, WriteZeroes OpStats
}

func (o *OpStats) add(p *OpStats) {
	o.Requests += p.Requests
	o.Errors += p.Errors
	o.Bytes += p.Bytes
	o.Queued += p.Queued
	for i := range o.Latency {
		o.Latency[i] += p.Latency[i]
	}
	o.LatencySum += p.LatencySum
}

func (s *Stats) add(t *Stats) {
	s.Read.add(&t.Read)
	s.Write.add(&t.Write)
	s.Flush.add(&t.Flush)
	s.Trim.add(&t.Trim)
	s.WriteZeroes.add(&t.WriteZeroes)
}

// epoch is the origin of request.start: time.Since reads the monotonic clock only.
var epoch = time.Now()

// record counts r's reply. It runs under the connection's write lock, so the counters need
// no atomic operations and no cache line is shared with another connection.
func (s *Stats) record(r *request) {
	var o *OpStats
	switch r.cmd {
	case CmdRead:
		o = &s.Read
	case CmdWrite:
		o = &s.Write
	case CmdFlush:
		o = &s.Flush
	case CmdTrim:
		o = &s.Trim
	case CmdWriteZeroes:
		o = &s.WriteZeroes
	default:
		return
	}
	o.Requests++
	if r.queued {
		o.Queued++
	}
	if r.errno != ErrnoNone {
		o.Errors++
	} else {
		o.Bytes += uint64(r.length)
	}
	d := time.Since(epoch) - r.start
	i := 0
	for i < len(LatencyBounds) && d > LatencyBounds[i] {
		i++
	}
	o.Latency[i]++
	o.LatencySum += d
}

// Stats returns the request counters of the export name: those of its ended connections
// and, read under each one's write lock, of its live ones.
func (s *Server) Stats(name string) (Stats, error) {
	x, ok := s.exports[name]
	if !ok {
		return Stats{}, fmt.Errorf("%w: %q", ErrUnknownExport, name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := x.ended
	for c := range s.conns {
		if c.counted != x {
			continue
		}
		c.wmu.Lock()
		st.add(&c.stats)
		c.wmu.Unlock()
	}
	return st, nil
}
