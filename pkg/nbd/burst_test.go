package nbd

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// inlinedRequests counts the requests the readers of srv's connections executed themselves.
func inlinedRequests(srv *Server) uint64 {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	n := uint64(0)
	for c := range srv.conns {
		n += c.inlined.Load()
	}
	return n
}

// sendBurst writes n requests to c in one write: reads of 4 KiB block i for odd i, writes of
// block i filled with byte i for even i; handles are i.
func sendBurst(c *rawClient, n int) {
	c.t.Helper()
	var b []byte
	for i := 0; i < n; i++ {
		cmd := CmdRead
		if i%2 == 0 {
			cmd = CmdWrite
		}
		var h [requestHeaderSize]byte
		binary.BigEndian.PutUint32(h[0:], magicRequest)
		binary.BigEndian.PutUint16(h[6:], uint16(cmd))
		binary.BigEndian.PutUint64(h[8:], uint64(i))
		binary.BigEndian.PutUint64(h[16:], uint64(i)*4096)
		binary.BigEndian.PutUint32(h[24:], 4096)
		b = append(b, h[:]...)
		if cmd == CmdWrite {
			b = append(b, bytes.Repeat([]byte{byte(i)}, 4096)...)
		}
	}
	c.write(b)
}

// readBurst reads the n replies of sendBurst (in any order) within 10 s and checks them.
func readBurst(c *rawClient, n int) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second)) // a reply left unflushed fails here
	defer c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	seen := map[uint64]bool{}
	page := make([]byte, 4096)
	for range n {
		h, errno := c.reply()
		if errno != 0 || h >= uint64(n) || seen[h] {
			c.t.Fatalf("reply %d errno %d (seen %v)", h, errno, seen)
		}
		seen[h] = true
		if h%2 == 1 {
			c.read(page)
		}
	}
}

// TestBurstServedInline: on a memory-speed backend, the reader executes a burst of reads and
// writes itself (no hand-off to a worker), and every reply arrives, including those it held
// back for one write at the end of the burst. On a backend with latency the same burst goes
// to the workers, so the requests run in parallel.
func TestBurstServedInline(t *testing.T) {
	const n = 32
	mem := newMemBackend(4 << 20)
	// Memory-speed whatever the machine's load (and the race detector's slowness).
	srv, sock := startServer(t, Options{fastExec: time.Hour}, Export{Backend: mem})
	c := dialRaw(t, sock)
	c.goExport("")
	for range 3 {
		sendBurst(c, n)
		readBurst(c, n)
	}
	if got := inlinedRequests(srv); got != 3*n {
		t.Fatalf("memory-speed backend: the reader executed %d of %d requests itself", got, 3*n)
	}

	slow := delayBackend{newMemBackend(4 << 20), 200 * time.Microsecond}
	srv, sock = startServer(t, Options{}, Export{Backend: slow})
	c = dialRaw(t, sock)
	c.goExport("")
	for range 3 {
		sendBurst(c, n)
		readBurst(c, n)
	}
	// The first request teaches the connection the backend's speed (200 us or more).
	if got := inlinedRequests(srv); got > n {
		t.Fatalf("backend with latency: the reader executed %d of %d requests itself", got, 3*n)
	}
	t.Logf("backend with latency: %d of %d requests executed by the reader", inlinedRequests(srv), 3*n)
}

// TestHeldReplyNotStuckBehindSlowRequest: the reader executes a burst itself and holds the
// first write's reply back for the burst's one write; the next request of the burst stalls.
// The held reply must still reach the client while the stalled one is stuck (the watchdog's
// new reader flushes it).
func TestHeldReplyNotStuckBehindSlowRequest(t *testing.T) {
	const x = 2 << 20
	b := newHoldBackend(4<<20, x)
	srv, sock := startServer(t, Options{fastExec: time.Hour}, Export{Backend: b})
	t.Cleanup(b.unhold)
	c := dialRaw(t, sock)
	c.goExport("")
	var burst []byte
	for i, off := range []uint64{0, x} {
		var h [requestHeaderSize]byte
		binary.BigEndian.PutUint32(h[0:], magicRequest)
		binary.BigEndian.PutUint16(h[6:], uint16(CmdWrite))
		binary.BigEndian.PutUint64(h[8:], uint64(i+1))
		binary.BigEndian.PutUint64(h[16:], off)
		binary.BigEndian.PutUint32(h[24:], 4096)
		burst = append(append(burst, h[:]...), fill('W')...)
	}
	c.write(burst)
	if h, errno, ok := c.replyWithin(10 * time.Second); !ok || h != 1 || errno != 0 {
		t.Fatalf("first write's reply: %d errno %d ok %v, want 1 while the second is stuck", h, errno, ok)
	}
	if b.held.Load() != 1 {
		t.Fatalf("%d writes held, want the second", b.held.Load())
	}
	if inlinedRequests(srv) == 0 || srv.takeovers.Load() == 0 {
		t.Fatalf("inlined %d, takeovers %d: the test did not exercise a held reply", inlinedRequests(srv), srv.takeovers.Load())
	}
	b.unhold()
	if h, errno := c.reply(); h != 2 || errno != 0 {
		t.Fatalf("second write's reply: %d errno %d", h, errno)
	}
}
