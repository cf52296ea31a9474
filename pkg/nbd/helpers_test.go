package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// needBinary returns the path of a client binary; missing, it ends the test through
// testenv.Missing (fails under CI, skips elsewhere).
func needBinary(t testing.TB, name string) string {
	t.Helper()
	return testenv.Tool(t, name, "hack/install-deps.sh installs it")
}

// countingBackend counts the flushes, discards and FUA writes that reach a FileBackend.
type countingBackend struct {
	*FileBackend
	flushes, discards, fuaWrites, zeroes atomic.Int64
}

func (b *countingBackend) Flush() error { b.flushes.Add(1); return b.FileBackend.Flush() }
func (b *countingBackend) Discard(off, n int64) error {
	b.discards.Add(1)
	return b.FileBackend.Discard(off, n)
}
func (b *countingBackend) WriteAtFUA(p []byte, off int64) (int, error) {
	b.fuaWrites.Add(1)
	return b.FileBackend.WriteAtFUA(p, off)
}
func (b *countingBackend) WriteZeroes(off, n int64) error {
	b.zeroes.Add(1)
	return b.FileBackend.WriteZeroes(off, n)
}

// memBackend is an in-memory Backend whose errors and delays a test sets.
type memBackend struct {
	mu      sync.RWMutex
	data    []byte
	readErr error
	// gate, when set, blocks reads at offset 0 until it is closed.
	gate chan struct{}
	// stallEvery, when set, makes every stallEvery-th read or write sleep 5 ms: long enough
	// for the watchdog to take the reader role over.
	stallEvery int64
	ops        atomic.Int64
}

func (m *memBackend) maybeStall() {
	if m.stallEvery > 0 && m.ops.Add(1)%m.stallEvery == 0 {
		time.Sleep(5 * time.Millisecond)
	}
}

func newMemBackend(size int) *memBackend { return &memBackend{data: make([]byte, size)} }

func (m *memBackend) ReadAt(p []byte, off int64) (int, error) {
	if m.gate != nil && off == 0 {
		<-m.gate
	}
	m.maybeStall()
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.readErr != nil {
		return 0, m.readErr
	}
	return copy(p, m.data[off:]), nil
}

func (m *memBackend) WriteAt(p []byte, off int64) (int, error) {
	m.maybeStall()
	m.mu.Lock()
	defer m.mu.Unlock()
	if off == 1<<20 {
		return 0, fmt.Errorf("member full: %w", syscall.ENOSPC)
	}
	return copy(m.data[off:], p), nil
}

func (m *memBackend) Size() int64  { return int64(len(m.data)) }
func (m *memBackend) Flush() error { return nil }

// startServer serves exports on a unix socket in a private temporary directory and returns
// the socket path. The server is shut down when the test ends.
func startServer(t testing.TB, opts Options, exports ...Export) (*Server, string) {
	t.Helper()
	srv, err := NewServer(opts, exports...)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nbdtest")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "nbd.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
		os.RemoveAll(dir)
	})
	return srv, sock
}

func fileExport(t testing.TB, size int64) (*countingBackend, Export) {
	t.Helper()
	fb, err := OpenFileBackend(filepath.Join(t.TempDir(), "disk.img"), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fb.Close() })
	cb := &countingBackend{FileBackend: fb}
	return cb, Export{Name: "", Description: "test disk", Backend: cb}
}

func uri(sock string) string { return "nbd+unix:///?socket=" + sock }

// rawClient speaks the protocol by hand, to test what real clients never send.
type rawClient struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(t testing.TB, sock string) *rawClient {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := &rawClient{t: t, nc: nc, br: bufio.NewReader(nc)}
	var g [18]byte
	c.read(g[:])
	if binary.BigEndian.Uint64(g[0:]) != magicNBD || binary.BigEndian.Uint64(g[8:]) != magicOption {
		t.Fatalf("bad greeting %x", g)
	}
	c.write(binary.BigEndian.AppendUint32(nil, uint32(FlagFixedNewstyle|FlagNoZeroes)))
	return c
}

func (c *rawClient) read(p []byte) {
	c.t.Helper()
	if _, err := io.ReadFull(c.br, p); err != nil {
		c.t.Fatalf("read: %v", err)
	}
}

func (c *rawClient) write(p []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(p); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *rawClient) option(id OptionID, data []byte) {
	c.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, magicOption)
	b = binary.BigEndian.AppendUint32(b, uint32(id))
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	c.write(append(b, data...))
}

// optReply reads one option reply.
func (c *rawClient) optReply() (OptionID, ReplyType, []byte) {
	c.t.Helper()
	var h [20]byte
	c.read(h[:])
	if binary.BigEndian.Uint64(h[0:]) != magicOptionReply {
		c.t.Fatalf("bad option reply magic %x", h)
	}
	data := make([]byte, binary.BigEndian.Uint32(h[16:]))
	c.read(data)
	return OptionID(binary.BigEndian.Uint32(h[8:])), ReplyType(binary.BigEndian.Uint32(h[12:])), data
}

func goData(name string, infos ...InfoType) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, uint16(i))
	}
	return b
}

// goExport sends OPT_GO and reads replies up to the ACK; it returns the export's size and
// flags.
func (c *rawClient) goExport(name string) (uint64, TransmissionFlags) {
	c.t.Helper()
	c.option(OptGo, goData(name))
	var size uint64
	var flags TransmissionFlags
	for {
		_, typ, data := c.optReply()
		switch typ {
		case RepInfo:
			if InfoType(binary.BigEndian.Uint16(data)) == InfoExport {
				size = binary.BigEndian.Uint64(data[2:])
				flags = TransmissionFlags(binary.BigEndian.Uint16(data[10:]))
			}
		case RepAck:
			return size, flags
		default:
			c.t.Fatalf("OPT_GO: reply type %#x", typ)
		}
	}
}

func (c *rawClient) request(cmd Command, flags CommandFlags, handle, off uint64, length uint32, payload []byte) {
	c.t.Helper()
	b := make([]byte, requestHeaderSize, requestHeaderSize+len(payload))
	binary.BigEndian.PutUint32(b[0:], magicRequest)
	binary.BigEndian.PutUint16(b[4:], uint16(flags))
	binary.BigEndian.PutUint16(b[6:], uint16(cmd))
	binary.BigEndian.PutUint64(b[8:], handle)
	binary.BigEndian.PutUint64(b[16:], off)
	binary.BigEndian.PutUint32(b[24:], length)
	c.write(append(b, payload...))
}

// reply reads a simple reply header.
func (c *rawClient) reply() (handle uint64, errno Errno) {
	c.t.Helper()
	var h [replyHeaderSize]byte
	c.read(h[:])
	if binary.BigEndian.Uint32(h[0:]) != magicReply {
		c.t.Fatalf("bad reply magic %x", h)
	}
	return binary.BigEndian.Uint64(h[8:]), Errno(binary.BigEndian.Uint32(h[4:]))
}
