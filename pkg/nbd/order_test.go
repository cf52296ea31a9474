package nbd

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdBackend is an in-memory Backend that holds the writes to the offsets in hold until
// release is closed, and counts the writes that reach each 4 KiB block.
type holdBackend struct {
	*memBackend
	hold    map[int64]bool // set before serving
	release chan struct{}
	held    atomic.Int32 // writes held now
	writes  []atomic.Int32
	// unhold closes release, once. Tests register it with t.Cleanup after starting the
	// server, so that it runs before the server's Shutdown (which waits for held writes).
	unhold func()
}

func newHoldBackend(size int, hold ...int64) *holdBackend {
	b := &holdBackend{memBackend: newMemBackend(size), hold: map[int64]bool{},
		release: make(chan struct{}), writes: make([]atomic.Int32, size/4096)}
	for _, off := range hold {
		b.hold[off] = true
	}
	b.unhold = sync.OnceFunc(func() { close(b.release) })
	return b
}

func (b *holdBackend) WriteAt(p []byte, off int64) (int, error) {
	b.writes[off/4096].Add(1)
	if b.hold[off] {
		b.held.Add(1)
		<-b.release
		b.held.Add(-1)
	}
	return b.memBackend.WriteAt(p, off)
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// queuedSlots counts the requests read and not started, over the server's connections.
func queuedSlots(srv *Server) int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	n := 0
	for c := range srv.conns {
		for i := range c.slots {
			if c.slots[i].state.Load()&slotBase == slotQueued {
				n++
			}
		}
	}
	return n
}

func fill(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }

// replyWithin reads one reply header if one comes within d; ok is false on a timeout.
func (c *rawClient) replyWithin(d time.Duration) (handle uint64, errno Errno, ok bool) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	defer c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.br.Peek(replyHeaderSize); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, 0, false
		}
		c.t.Fatalf("read: %v", err)
	}
	h, e := c.reply()
	return h, e, true
}

// checkNewerWriteWins is the second half of the ordering tests: the connection that held
// writes to x and x+4096 is gone, so those writes are orphans. A newer write to x on another
// connection must wait for them (while a write elsewhere does not), land after them, and be
// what a read returns.
func checkNewerWriteWins(t *testing.T, srv *Server, sock string, b *holdBackend, x uint64) {
	t.Helper()
	f := &srv.exports[""].fence
	waitFor(t, "the held writes to become orphans", func() bool { return f.n.Load() == 2 })
	c2 := dialRaw(t, sock)
	c2.goExport("")
	c2.request(CmdWrite, 0, 11, 3<<20, 4096, fill('C')) // overlaps nothing: never waits
	if h, errno, ok := c2.replyWithin(5 * time.Second); !ok || h != 11 || errno != 0 {
		t.Fatalf("write beside the orphans: reply %d errno %d ok %v, want 11 at once", h, errno, ok)
	}
	c2.request(CmdWrite, 0, 10, x, 4096, fill('B')) // newer, overlaps an orphan
	if h, _, ok := c2.replyWithin(200 * time.Millisecond); ok {
		t.Fatalf("reply %d while an overlapping orphan still runs: the newer write did not wait", h)
	}
	b.unhold()
	if h, errno := c2.reply(); h != 10 || errno != 0 {
		t.Fatalf("newer write: reply %d errno %d", h, errno)
	}
	waitFor(t, "the orphans to leave the fence", func() bool { return f.n.Load() == 0 })
	c2.request(CmdRead, 0, 12, x, 4096, nil)
	if h, errno := c2.reply(); h != 12 || errno != 0 {
		t.Fatalf("read: reply %d errno %d", h, errno)
	}
	got := make([]byte, 4096)
	c2.read(got)
	if !bytes.Equal(got, fill('B')) {
		t.Fatalf("block %d holds %q..., want the newer write's B", x/4096, got[:8])
	}
}

// TestStaleWriteNeverOvertakes is the sequence of a kernel request timeout: a write is stuck
// in the backend when its connection ends (the kernel gave up on the socket and re-sends the
// write elsewhere). The requests queued behind it on that connection never run, and a newer
// write to the same block on another connection lands after the stuck one.
func TestStaleWriteNeverOvertakes(t *testing.T) {
	const x = 0
	b := newHoldBackend(4<<20, x, x+4096)
	srv, sock := startServer(t, Options{Workers: 1}, Export{Backend: b})
	t.Cleanup(b.unhold)

	c1 := dialRaw(t, sock)
	c1.goExport("")
	c1.request(CmdWrite, 0, 1, x, 4096, fill('A')) // alone: the reader runs it, and is stuck
	waitFor(t, "the first write to be held", func() bool { return b.held.Load() == 1 })
	c1.request(CmdWrite, 0, 2, x+4096, 4096, fill('A')) // the only worker takes it, stuck
	waitFor(t, "the second write to be held", func() bool { return b.held.Load() == 2 })
	for h := uint64(3); h < 7; h++ { // queued behind the stuck worker
		c1.request(CmdWrite, 0, h, h*64<<10, 4096, fill('Q'))
	}
	waitFor(t, "4 queued requests", func() bool { return queuedSlots(srv) == 4 })
	c1.nc.Close() // the kernel's nbd driver shuts the socket down after a request timeout

	checkNewerWriteWins(t, srv, sock, b, x)
	for h := 3; h < 7; h++ {
		if n := b.writes[h*16].Load(); n != 0 {
			t.Errorf("queued write %d of the dead connection ran %d times", h, n)
		}
	}
}

// TestBackpressuredReaderSeesHangup: every slot of the connection is stuck in the backend,
// so its reader waits for a slot with more requests unread in the socket, and sees no end
// of file. It must still notice the hang-up (so that the stuck writes fence the newer ones
// at once), and what sat in the socket must never run.
func TestBackpressuredReaderSeesHangup(t *testing.T) {
	const x = 64 << 10
	b := newHoldBackend(4<<20, x, x+4096)
	srv, sock := startServer(t, Options{MaxInflight: 2, Workers: 2}, Export{Backend: b})
	t.Cleanup(b.unhold)

	c1 := dialRaw(t, sock)
	c1.goExport("")
	c1.request(CmdWrite, 0, 1, x, 4096, fill('A'))
	c1.request(CmdWrite, 0, 2, x+4096, 4096, fill('A'))
	waitFor(t, "both slots held", func() bool { return b.held.Load() == 2 })
	for h := uint64(3); h < 7; h++ { // unread: no slot is free
		c1.request(CmdWrite, 0, h, h*128<<10, 4096, fill('Q'))
	}
	time.Sleep(20 * time.Millisecond)
	c1.nc.Close()

	checkNewerWriteWins(t, srv, sock, b, x)
	for h := 3; h < 7; h++ {
		if n := b.writes[h*32].Load(); n != 0 {
			t.Errorf("write %d, unread when the peer left, ran %d times", h, n)
		}
	}
}

// TestHalfCloseStillAnswered: a client that shuts down only its sending side still reads,
// so the requests it sent before are executed and answered, as after NBD_CMD_DISC.
func TestHalfCloseStillAnswered(t *testing.T) {
	b := newHoldBackend(4<<20, 0)
	_, sock := startServer(t, Options{Workers: 1}, Export{Backend: b})
	t.Cleanup(b.unhold)
	c := dialRaw(t, sock)
	c.goExport("")
	for h := uint64(0); h < 8; h++ {
		c.request(CmdWrite, 0, h, h*4096, 4096, fill('H'))
	}
	waitFor(t, "the first write to be held", func() bool { return b.held.Load() == 1 })
	if err := c.nc.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	b.unhold()
	seen := map[uint64]bool{}
	for range 8 {
		h, errno := c.reply()
		if errno != 0 {
			t.Fatalf("reply %d errno %d", h, errno)
		}
		seen[h] = true
	}
	if len(seen) != 8 {
		t.Fatalf("replies %v", seen)
	}
	if _, err := c.br.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after the replies: %v, want end of file", err)
	}
}

// TestSlowWriteFencesLaterOverlaps: a write in flight for Options.SlowWrite is fenced while
// its connection is still alive (the server cannot know yet that the client gave up on it):
// an overlapping write that arrives later on another connection waits for it and lands
// after it; a read of the block does not wait.
func TestSlowWriteFencesLaterOverlaps(t *testing.T) {
	const x = 128 << 10
	b := newHoldBackend(4<<20, x)
	srv, sock := startServer(t, Options{SlowWrite: 20 * time.Millisecond}, Export{Backend: b})
	t.Cleanup(b.unhold)
	f := &srv.exports[""].fence

	c1 := dialRaw(t, sock)
	c1.goExport("")
	c1.request(CmdWrite, 0, 1, x, 4096, fill('A'))
	waitFor(t, "the slow write to be fenced", func() bool { return b.held.Load() == 1 && f.n.Load() == 1 })

	c2 := dialRaw(t, sock)
	c2.goExport("")
	c2.request(CmdRead, 0, 2, x, 4096, nil) // reads never wait
	if h, errno, ok := c2.replyWithin(5 * time.Second); !ok || h != 2 || errno != 0 {
		t.Fatalf("read of the block: reply %d errno %d ok %v, want it at once", h, errno, ok)
	}
	c2.read(make([]byte, 4096))
	c2.request(CmdWrite, 0, 3, x, 4096, fill('B'))
	if h, _, ok := c2.replyWithin(200 * time.Millisecond); ok {
		t.Fatalf("reply %d while the slow overlapping write still runs", h)
	}
	b.unhold()
	if h, errno := c1.reply(); h != 1 || errno != 0 {
		t.Fatalf("slow write: reply %d errno %d", h, errno)
	}
	if h, errno := c2.reply(); h != 3 || errno != 0 {
		t.Fatalf("later write: reply %d errno %d", h, errno)
	}
	waitFor(t, "the fence to empty", func() bool { return f.n.Load() == 0 })
	c2.request(CmdRead, 0, 4, x, 4096, nil)
	if h, errno := c2.reply(); h != 4 || errno != 0 {
		t.Fatalf("read: reply %d errno %d", h, errno)
	}
	got := make([]byte, 4096)
	c2.read(got)
	if !bytes.Equal(got, fill('B')) {
		t.Fatalf("block holds %q..., want the later write's B", got[:8])
	}
}

// TestGuardStopsWhenIdle checks that the guard a write started ends once no write is in
// flight, so that an idle server has no ticking goroutine.
func TestGuardStopsWhenIdle(t *testing.T) {
	srv, sock := startServer(t, Options{SlowWrite: 20 * time.Millisecond}, Export{Backend: newMemBackend(1 << 20)})
	c := dialRaw(t, sock)
	c.goExport("")
	c.request(CmdWrite, 0, 1, 0, 4096, fill('W'))
	if h, errno := c.reply(); h != 1 || errno != 0 {
		t.Fatalf("reply %d errno %d", h, errno)
	}
	if !srv.guarding.Load() {
		t.Fatal("no guard after a write")
	}
	waitFor(t, "the guard to stop", func() bool { return !srv.guarding.Load() })
	c.request(CmdRead, 0, 2, 0, 4096, nil) // reads start no guard
	if h, errno := c.reply(); h != 2 || errno != 0 {
		t.Fatalf("reply %d errno %d", h, errno)
	}
	c.read(make([]byte, 4096))
	if srv.guarding.Load() {
		t.Fatal("a read started the guard")
	}
}

// connWorkers is how many workers each connection of srv has started.
func connWorkers(srv *Server) []int32 {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var n []int32
	for c := range srv.conns {
		n = append(n, c.nWorkers.Load())
	}
	return n
}

// TestWorkersStartOnDemand: a connection starts no worker until a request needs one (a node
// holds hundreds of idle devices), then one per request that finds none waiting, up to
// Options.Workers; past that bound requests queue for the first worker done, and every one
// is answered.
func TestWorkersStartOnDemand(t *testing.T) {
	const workers, requests = 4, 6
	var held []int64
	for h := range requests {
		held = append(held, int64(h)*64<<10)
	}
	b := newHoldBackend(4<<20, held...)
	srv, sock := startServer(t, Options{Workers: workers, MaxInflight: 16}, Export{Backend: b})
	t.Cleanup(b.unhold)

	c := dialRaw(t, sock)
	c.goExport("")
	waitFor(t, "the connection registered", func() bool { return len(connWorkers(srv)) == 1 })
	if n := connWorkers(srv)[0]; n != 0 {
		t.Fatalf("an idle connection started %d workers, want 0", n)
	}
	// FUA writes always go to the workers (conn.inline).
	for h := range uint64(requests) {
		c.request(CmdWrite, CmdFlagFUA, h, h*64<<10, 4096, fill('W'))
	}
	waitFor(t, "a write held on each worker", func() bool { return b.held.Load() == workers })
	time.Sleep(20 * time.Millisecond)
	if n := connWorkers(srv)[0]; n != workers {
		t.Fatalf("%d writes stuck in the backend started %d workers, want the bound %d", requests, n, workers)
	}
	if h := b.held.Load(); h != workers {
		t.Fatalf("%d writes in the backend with %d workers", h, workers)
	}
	b.unhold()
	seen := map[uint64]bool{}
	for range requests {
		h, errno := c.reply()
		if errno != ErrnoNone {
			t.Fatalf("write %d: %v", h, errno)
		}
		seen[h] = true
	}
	if len(seen) != requests {
		t.Fatalf("answered %v, want %d distinct writes", seen, requests)
	}
	if n := connWorkers(srv)[0]; n != workers {
		t.Fatalf("%d workers after the burst, want %d (they stay)", n, workers)
	}
}
