package nbd

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// fuzzConn is a net.Conn that reads a fixed input and swallows what the server writes.
type fuzzConn struct {
	mu     sync.Mutex
	r      *bytes.Reader
	closed bool
}

func (f *fuzzConn) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, net.ErrClosed
	}
	return f.r.Read(p)
}
func (f *fuzzConn) Write(p []byte) (int, error) { return len(p), nil }
func (f *fuzzConn) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	return nil
}
func (f *fuzzConn) LocalAddr() net.Addr                { return &net.UnixAddr{} }
func (f *fuzzConn) RemoteAddr() net.Addr               { return &net.UnixAddr{} }
func (f *fuzzConn) SetDeadline(t time.Time) error      { return nil }
func (f *fuzzConn) SetReadDeadline(t time.Time) error  { return nil }
func (f *fuzzConn) SetWriteDeadline(t time.Time) error { return nil }

func fuzzServer(t testing.TB) *Server {
	srv, err := NewServer(Options{MaxRequestSize: 64 << 10, MaxInflight: 8, Workers: 2, MemoryLimit: 256 << 10},
		Export{Name: "", Backend: newMemBackend(1 << 20)},
		Export{Name: "ro", Backend: newMemBackend(64 << 10), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// within fails the fuzz input if f does not return in time: a hang is a bug.
func within(t *testing.T, f func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("server hangs on this input")
	}
}

func reqBytes(cmd Command, flags CommandFlags, handle, off uint64, length uint32, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, magicRequest)
	b = binary.BigEndian.AppendUint16(b, uint16(flags))
	b = binary.BigEndian.AppendUint16(b, uint16(cmd))
	b = binary.BigEndian.AppendUint64(b, handle)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint32(b, length)
	return append(b, payload...)
}

func optBytes(id OptionID, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, magicOption)
	b = binary.BigEndian.AppendUint32(b, uint32(id))
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// FuzzRequests feeds arbitrary bytes to the transmission phase (as the kernel's socket
// would): every input must end in a clean close, never a panic or a hang.
func FuzzRequests(f *testing.F) {
	f.Add(reqBytes(CmdRead, 0, 1, 0, 4096, nil))
	f.Add(append(reqBytes(CmdWrite, CmdFlagFUA, 2, 4096, 8, []byte("12345678")), reqBytes(CmdFlush, 0, 3, 0, 0, nil)...))
	f.Add(append(reqBytes(CmdTrim, 0, 4, 0, 1<<20, nil), reqBytes(CmdWriteZeroes, 0, 5, 1<<19, 1<<19, nil)...))
	f.Add(reqBytes(CmdWrite, 0, 6, 0, 1<<30, []byte("short")))
	f.Add(reqBytes(CmdRead, 0, 7, ^uint64(0), 1, nil))
	f.Add(reqBytes(CmdDisc, 0, 8, 0, 0, nil))
	f.Add([]byte{0x25, 0x60, 0x95})
	srv := fuzzServer(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		within(t, func() {
			c := srv.newConn(&fuzzConn{r: bytes.NewReader(in)})
			c.exp = srv.exports[""]
			_ = c.transmit() // releases c
		})
	})
}

// FuzzNegotiation feeds arbitrary client bytes to the handshake and, if it reaches the
// transmission phase, to the requests that follow.
func FuzzNegotiation(f *testing.F) {
	flags := binary.BigEndian.AppendUint32(nil, uint32(FlagFixedNewstyle|FlagNoZeroes))
	seed := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{flags}, parts...), nil) }
	f.Add(seed(optBytes(OptGo, goData("", InfoName)), reqBytes(CmdRead, 0, 1, 0, 512, nil)))
	f.Add(seed(optBytes(OptList, nil), optBytes(OptInfo, goData("ro", InfoBlockSize)), optBytes(OptAbort, nil)))
	f.Add(seed(optBytes(OptExportName, []byte("ro")), reqBytes(CmdWrite, 0, 1, 0, 1, []byte{1})))
	f.Add(seed(optBytes(OptStructuredReply, nil), optBytes(OptGo, []byte{0, 0, 0, 200, 1})))
	f.Add(seed(binary.BigEndian.AppendUint64(nil, magicOption), []byte{0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff}))
	f.Add([]byte{0, 0, 0, 4})
	srv := fuzzServer(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		within(t, func() {
			c := srv.newConn(&fuzzConn{r: bytes.NewReader(in)})
			if err := c.negotiate(); err != nil {
				srv.release(c)
				return
			}
			_ = c.transmit() // releases c
		})
	})
}

var _ io.Reader = (*fuzzConn)(nil)
