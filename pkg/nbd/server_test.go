package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

func TestNegotiation(t *testing.T) {
	mem := newMemBackend(1 << 20)
	_, sock := startServer(t, Options{},
		Export{Name: "a", Description: "disk a", Backend: mem},
		Export{Name: "b", Backend: mem, ReadOnly: true})

	t.Run("list", func(t *testing.T) {
		c := dialRaw(t, sock)
		c.option(OptList, nil)
		names := map[string]bool{}
		for {
			_, typ, data := c.optReply()
			if typ == RepAck {
				break
			}
			if typ != RepServer {
				t.Fatalf("reply type %#x", typ)
			}
			names[string(data[4:4+binary.BigEndian.Uint32(data)])] = true
		}
		if !names["a"] || !names["b"] || len(names) != 2 {
			t.Fatalf("listed %v", names)
		}
	})
	t.Run("unknown option refused, negotiation goes on", func(t *testing.T) {
		c := dialRaw(t, sock)
		for _, id := range []OptionID{OptStructuredReply, OptStartTLS, OptSetMetaContext, 0x7777} {
			c.option(id, []byte("xyz"))
			if gotID, typ, _ := c.optReply(); gotID != id || typ != RepErrUnsup {
				t.Fatalf("option %d: reply %d %#x", id, gotID, typ)
			}
		}
		if size, _ := c.goExport("a"); size != 1<<20 {
			t.Fatalf("size %d", size)
		}
	})
	t.Run("info then go", func(t *testing.T) {
		c := dialRaw(t, sock)
		c.option(OptInfo, goData("a", InfoName, InfoDescription, InfoBlockSize))
		got := map[InfoType][]byte{}
		for {
			_, typ, data := c.optReply()
			if typ == RepAck {
				break
			}
			got[InfoType(binary.BigEndian.Uint16(data))] = data[2:]
		}
		if string(got[InfoName]) != "a" || string(got[InfoDescription]) != "disk a" {
			t.Fatalf("name %q description %q", got[InfoName], got[InfoDescription])
		}
		bs := got[InfoBlockSize]
		if binary.BigEndian.Uint32(bs[0:]) != 1 || binary.BigEndian.Uint32(bs[4:]) != 4096 ||
			binary.BigEndian.Uint32(bs[8:]) != DefaultMaxRequestSize {
			t.Fatalf("block sizes %x", bs)
		}
		flags := TransmissionFlags(binary.BigEndian.Uint16(got[InfoExport][8:]))
		want := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn
		if flags != want {
			t.Fatalf("flags %#x, want %#x", flags, want)
		}
		if _, flags := c.goExport("b"); flags&FlagReadOnly == 0 {
			t.Fatalf("read-only export advertises %#x", flags)
		}
	})
	t.Run("unknown export and malformed data", func(t *testing.T) {
		c := dialRaw(t, sock)
		c.option(OptGo, goData("nope"))
		if _, typ, _ := c.optReply(); typ != RepErrUnknown {
			t.Fatalf("unknown export: %#x", typ)
		}
		c.option(OptGo, []byte{0, 0, 0, 9, 'x'})
		if _, typ, _ := c.optReply(); typ != RepErrInvalid {
			t.Fatalf("malformed: %#x", typ)
		}
		c.option(OptList, []byte("x"))
		if _, typ, _ := c.optReply(); typ != RepErrInvalid {
			t.Fatalf("list with data: %#x", typ)
		}
		c.option(OptGo, make([]byte, maxOptionLength+1))
		if _, typ, _ := c.optReply(); typ != RepErrTooBig {
			t.Fatalf("oversized: %#x", typ)
		}
		c.option(OptAbort, nil)
		if _, typ, _ := c.optReply(); typ != RepAck {
			t.Fatalf("abort: %#x", typ)
		}
	})
	t.Run("export name", func(t *testing.T) {
		c := dialRaw(t, sock)
		c.option(OptExportName, []byte("a"))
		var b [10]byte
		c.read(b[:])
		if binary.BigEndian.Uint64(b[:]) != 1<<20 {
			t.Fatalf("size %x", b)
		}
		c.request(CmdRead, 0, 1, 0, 512, nil)
		if _, errno := c.reply(); errno != 0 {
			t.Fatalf("read: %d", errno)
		}
	})
}

// TestRequestErrors checks that every failed request gets its own error reply and the
// connection goes on serving.
func TestRequestErrors(t *testing.T) {
	mem := newMemBackend(2 << 20)
	_, sock := startServer(t, Options{MaxRequestSize: 1 << 20},
		Export{Name: "rw", Backend: mem}, Export{Name: "ro", Backend: mem, ReadOnly: true})
	c := dialRaw(t, sock)
	c.goExport("rw")
	ro := dialRaw(t, sock)
	ro.goExport("ro")

	page := bytes.Repeat([]byte{7}, 4096)
	cases := []struct {
		name    string
		c       *rawClient
		cmd     Command
		off     uint64
		length  uint32
		payload []byte
		want    Errno
	}{
		{"write ok", c, CmdWrite, 0, 4096, page, ErrnoNone},
		{"backend ENOSPC", c, CmdWrite, 1 << 20, 4096, page, ErrnoNoSpc},
		{"write past end", c, CmdWrite, 2<<20 - 100, 4096, page, ErrnoNoSpc},
		{"read past end", c, CmdRead, 2 << 20, 1, nil, ErrnoInval},
		{"offset overflow", c, CmdRead, ^uint64(0) - 10, 4096, nil, ErrnoInval},
		{"read over max request", c, CmdRead, 0, 1<<20 + 1, nil, ErrnoInval},
		{"write over max request", c, CmdWrite, 0, 1<<20 + 1, make([]byte, 1<<20+1), ErrnoInval},
		{"unknown command", c, 99, 0, 0, nil, ErrnoInval},
		{"block status not offered", c, CmdBlockStatus, 0, 4096, nil, ErrnoInval},
		{"trim past end", c, CmdTrim, 2 << 20, 4096, nil, ErrnoInval},
		{"read-only write", ro, CmdWrite, 0, 4096, page, ErrnoPerm},
		{"read-only trim", ro, CmdTrim, 0, 4096, nil, ErrnoPerm},
		{"read-only zero", ro, CmdWriteZeroes, 0, 4096, nil, ErrnoPerm},
		{"read-only read", ro, CmdRead, 0, 4096, nil, ErrnoNone},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.t = t
			tc.c.request(tc.cmd, 0, uint64(i), tc.off, tc.length, tc.payload)
			h, errno := tc.c.reply()
			if h != uint64(i) || errno != tc.want {
				t.Fatalf("reply handle %d errno %d, want %d %d", h, errno, i, tc.want)
			}
			if tc.cmd == CmdRead && errno == ErrnoNone {
				got := make([]byte, tc.length)
				tc.c.read(got)
				if !bytes.Equal(got, page) {
					t.Fatalf("read back wrong data")
				}
			}
		})
	}
	t.Run("backend EIO on read", func(t *testing.T) {
		c.t = t
		mem.mu.Lock()
		mem.readErr = os.ErrClosed // an error the protocol has no code for
		mem.mu.Unlock()
		c.request(CmdRead, 0, 100, 0, 4096, nil)
		if _, errno := c.reply(); errno != ErrnoIO {
			t.Fatalf("errno %d", errno)
		}
		mem.mu.Lock()
		mem.readErr = nil
		mem.mu.Unlock()
		c.request(CmdRead, 0, 101, 0, 4096, nil)
		if _, errno := c.reply(); errno != ErrnoNone {
			t.Fatalf("connection broken after an error: %d", errno)
		}
		c.read(make([]byte, 4096))
	})
}

func TestErrnoMapping(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want Errno
	}{
		{"nil", nil, ErrnoNone},
		{"wrapped ENOSPC", &os.PathError{Op: "write", Err: syscall.ENOSPC}, ErrnoNoSpc},
		{"EINVAL", syscall.EINVAL, ErrnoInval},
		{"EPERM", syscall.EPERM, ErrnoPerm},
		{"EROFS", syscall.EROFS, ErrnoPerm},
		{"EOPNOTSUPP has no NBD meaning", syscall.EOPNOTSUPP, ErrnoIO},
		{"other", syscall.EBADMSG, ErrnoIO},
		{"text is not matched", errString("no space left on device"), ErrnoIO},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := errnoOf(tc.err); got != tc.want {
				t.Fatalf("errnoOf(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestOutOfOrderReplies blocks one read in the backend and checks that later requests on the
// same connection are answered first. The blocked read arrives alone, so the reader executes
// it itself: the watchdog must hand the reader role to a new goroutine.
func TestOutOfOrderReplies(t *testing.T) {
	mem := newMemBackend(1 << 20)
	mem.gate = make(chan struct{})
	_, sock := startServer(t, Options{}, Export{Backend: mem})
	release := sync.OnceFunc(func() { close(mem.gate) })
	t.Cleanup(release) // runs before the server's Shutdown, even when the test fails
	c := dialRaw(t, sock)
	c.goExport("")
	c.request(CmdRead, 0, 1, 0, 4096, nil) // blocks in the backend
	// The blocked read arrives alone: the later requests come after the reader took it.
	time.Sleep(50 * time.Millisecond)
	for h := uint64(2); h < 10; h++ {
		c.request(CmdRead, 0, h, 4096*h, 4096, nil)
	}
	for h := uint64(2); h < 10; h++ {
		got, errno := c.reply()
		if got == 1 || errno != 0 {
			t.Fatalf("reply %d errno %d before the blocked read was released", got, errno)
		}
		c.read(make([]byte, 4096))
	}
	release()
	if got, _ := c.reply(); got != 1 {
		t.Fatalf("last reply %d", got)
	}
}

// TestWatchdogStopsWhenIdle checks that the watchdog a request started ends once requests
// stop, so that an idle server has no ticking goroutine.
func TestWatchdogStopsWhenIdle(t *testing.T) {
	mem := newMemBackend(1 << 20)
	mem.gate = make(chan struct{})
	srv, sock := startServer(t, Options{}, Export{Backend: mem})
	release := sync.OnceFunc(func() { close(mem.gate) })
	t.Cleanup(release)
	c := dialRaw(t, sock)
	c.goExport("")
	c.request(CmdRead, 0, 1, 0, 4096, nil) // alone: the reader executes it and blocks
	wait := func(running bool) {
		t.Helper()
		deadline := time.Now().Add(10 * watchIdle * watchTick)
		for srv.watching.Load() != running {
			if time.Now().After(deadline) {
				t.Fatalf("watchdog running=%v after %v, want %v", !running, 10*watchIdle*watchTick, running)
			}
			time.Sleep(watchTick)
		}
	}
	wait(true)
	release()
	if h, errno := c.reply(); h != 1 || errno != 0 {
		t.Fatalf("reply %d errno %d", h, errno)
	}
	c.read(make([]byte, 4096))
	wait(false)
}

// TestShutdownDrains checks that requests in flight are answered before the connection is
// closed by Shutdown.
func TestShutdownDrains(t *testing.T) {
	mem := newMemBackend(1 << 20)
	mem.gate = make(chan struct{})
	srv, err := NewServer(Options{}, Export{Backend: mem})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	c := dialRaw(t, filepath.Join(dir, "s"))
	c.goExport("")
	c.request(CmdRead, 0, 42, 0, 4096, nil)
	time.Sleep(50 * time.Millisecond)
	done := make(chan error)
	go func() { done <- srv.Shutdown(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	close(mem.gate)
	if h, errno := c.reply(); h != 42 || errno != 0 {
		t.Fatalf("reply %d %d", h, errno)
	}
	c.read(make([]byte, 4096))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.br.ReadByte(); err == nil {
		t.Fatal("connection still open after Shutdown")
	}
}

func TestListenPrivate(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(dir, "s")); err == nil {
		t.Fatal("listened in a directory others can enter")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	st, err := os.Stat(filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v", st.Mode())
	}
}

// TestSteadyStateAllocations drives one connection with reads and writes and checks that the
// server allocates nothing per request once warm: with the requests handed to workers, and
// with bursts served by the reader (a memory-speed backend, conn.inline).
func TestSteadyStateAllocations(t *testing.T) {
	testenv.Heavy(t, "drives many requests to measure allocations")
	t.Run("workers", func(t *testing.T) { steadyStateAllocations(t, Options{fastExec: time.Nanosecond}, false) })
	t.Run("bursts", func(t *testing.T) { steadyStateAllocations(t, Options{fastExec: time.Hour}, true) })
}

func steadyStateAllocations(t *testing.T, opts Options, bursts bool) {
	mem := newMemBackend(4 << 20)
	srv, sock := startServer(t, opts, Export{Backend: mem})
	c := dialRaw(t, sock)
	c.goExport("")
	page := make([]byte, 4096)
	req := make([]byte, 0, requestHeaderSize+4096)
	hdr := make([]byte, replyHeaderSize)
	round := func(n int) {
		for i := 0; i < n; i++ {
			// 16 requests in flight, then 16 replies.
			for j := 0; j < 16; j++ {
				cmd := CmdRead
				if j%2 == 0 {
					cmd = CmdWrite
				}
				req = req[:requestHeaderSize]
				binary.BigEndian.PutUint32(req[0:], magicRequest)
				binary.BigEndian.PutUint16(req[4:], 0)
				binary.BigEndian.PutUint16(req[6:], uint16(cmd))
				binary.BigEndian.PutUint64(req[8:], uint64(j))
				binary.BigEndian.PutUint64(req[16:], uint64(j)*4096)
				binary.BigEndian.PutUint32(req[24:], 4096)
				if cmd == CmdWrite {
					req = append(req, page...)
				}
				c.nc.Write(req)
			}
			for j := 0; j < 16; j++ {
				c.br.Read(hdr[:0])
				if _, err := ioReadFull(c, hdr); err != nil {
					t.Fatal(err)
				}
				if Command(binary.BigEndian.Uint64(hdr[8:])%2) == 1 { // odd handle: a read
					ioReadFull(c, page)
				}
			}
		}
	}
	round(200)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const rounds = 500
	round(rounds)
	runtime.ReadMemStats(&after)
	perRequest := float64(after.Mallocs-before.Mallocs) / (rounds * 16)
	t.Logf("%.3f allocations per request (server and test client together); %d of %d requests executed by the reader",
		perRequest, inlinedRequests(srv), (200+rounds)*16)
	if perRequest > 0.05 {
		t.Fatalf("%.3f allocations per request in steady state", perRequest)
	}
	if n := inlinedRequests(srv); bursts != (n > (200+rounds)*16/2) {
		t.Fatalf("%d of %d requests executed by the reader: not the path this run measures", n, (200+rounds)*16)
	}
}

func ioReadFull(c *rawClient, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := c.br.Read(p[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestNegotiationTimeout checks that a client that never finishes the handshake is dropped.
func TestNegotiationTimeout(t *testing.T) {
	_, sock := startServer(t, Options{NegotiationTimeout: 200 * time.Millisecond}, Export{Backend: newMemBackend(1 << 20)})
	c := dialRaw(t, sock)
	start := time.Now()
	if _, err := c.br.ReadByte(); err == nil {
		t.Fatal("server sent something unasked")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("dropped after %s", d)
	}
}
