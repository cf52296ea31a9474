package nbd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
)

// Sentinel errors of the package.
var (
	// ErrServerClosed is returned by Serve after Shutdown or Close.
	ErrServerClosed = errors.New("nbd: server closed")
	// ErrUnknownExport is returned when a connection asks for an export that does not exist.
	ErrUnknownExport = errors.New("nbd: unknown export")
	// ErrProtocol wraps every violation of the protocol by the peer.
	ErrProtocol = errors.New("nbd: protocol error")
	// ErrNotPrivate is returned by Listen when the socket directory is reachable by others.
	ErrNotPrivate = errors.New("nbd: socket directory is not private")
)

// Defaults of Options.
const (
	DefaultMaxRequestSize = 32 << 20
	DefaultMaxInflight    = 128
	DefaultWorkers        = 32
	DefaultMemoryLimit    = 128 << 20
	DefaultBlockSize      = 4096

	DefaultNegotiationTimeout = 30 * time.Second
	DefaultSlowWrite          = time.Second
)

// Export is one block device a Server offers under a name.
type Export struct {
	// Name is what clients ask for; "" is the default export.
	Name string
	// Description is shown by nbdinfo and OPT_LIST.
	Description string
	// Backend serves the data.
	Backend blockdev.Backend
	// ReadOnly refuses writes, trims and zeroes with EPERM and advertises READ_ONLY.
	ReadOnly bool
}

// Options tune a Server. The zero value takes every default.
type Options struct {
	// MaxRequestSize is the largest read or write accepted (advertised as the maximum block
	// size); larger ones get EINVAL (a write's payload is read and dropped). At most 32 MiB.
	MaxRequestSize int
	// MaxInflight bounds the requests read from one connection and not yet replied to.
	MaxInflight int
	// Workers is the number of goroutines per connection that call the Backend: how many
	// requests of one connection a device with latency serves in parallel (default 32).
	Workers int
	// MemoryLimit bounds the bytes of request buffers across all connections.
	MemoryLimit int64
	// BlockSize is the preferred block size advertised (default 4096).
	BlockSize int
	// NegotiationTimeout bounds the handshake of a connection (default 30s).
	NegotiationTimeout time.Duration
	// MinBlockSize is the minimum block size advertised (default 1). A backend that only
	// takes aligned I/O (the RAID10 engine: 4096) sets it so that clients align.
	MinBlockSize int
	// SlowWrite is how long a write, trim or zeroing may be in flight before it is fenced:
	// an overlapping one that arrives later waits for it (fence.go), so that a client's
	// re-sent copy of it, and what the client writes after, never land before it. It must
	// stay well below the client's request timeout (the kernel attach's, at least 2 s).
	// Default 1 s.
	SlowWrite time.Duration
	// SyncOnly serves every request through the Backend's blocking methods even when it is a
	// blockdev.AsyncBackend (whose reads and plain writes otherwise go through one
	// asynchronous queue per connection): benchmarks compare the two.
	SyncOnly bool

	// fastExec is the threshold of conn.inline (default the constant fastExec); tests set
	// another, so that what they check does not follow the machine's speed.
	fastExec time.Duration
}

func (o *Options) withDefaults() Options {
	r := *o
	if r.MaxRequestSize <= 0 || r.MaxRequestSize > 1<<maxBufferShift {
		r.MaxRequestSize = DefaultMaxRequestSize
	}
	if r.MaxInflight <= 0 {
		r.MaxInflight = DefaultMaxInflight
	}
	if r.Workers <= 0 {
		r.Workers = DefaultWorkers
	}
	if r.fastExec <= 0 {
		r.fastExec = fastExec
	}
	if r.Workers > r.MaxInflight {
		r.Workers = r.MaxInflight
	}
	if r.MemoryLimit < int64(r.MaxRequestSize) {
		r.MemoryLimit = max(DefaultMemoryLimit, int64(r.MaxRequestSize))
	}
	if r.BlockSize <= 0 {
		r.BlockSize = DefaultBlockSize
	}
	if r.NegotiationTimeout <= 0 {
		r.NegotiationTimeout = DefaultNegotiationTimeout
	}
	if r.SlowWrite <= 0 {
		r.SlowWrite = DefaultSlowWrite
	}
	if r.MinBlockSize <= 0 {
		r.MinBlockSize = 1
	}
	if r.BlockSize < r.MinBlockSize {
		r.BlockSize = r.MinBlockSize
	}
	return r
}

// Server serves a set of exports on unix sockets and on connected sockets handed to it (the
// server ends of the kernel attach).
type Server struct {
	opts    Options
	pool    *BufferPool
	exports map[string]*export

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   bool
	handing   bool // closing for a successor (HandOver): kernel connections are kept open
	wg        sync.WaitGroup

	watching  atomic.Bool   // the watchdog runs (watchdog.go)
	guarding  atomic.Bool   // the guard runs (fence.go)
	takeovers atomic.Uint64 // reader roles the watchdog passed on
}

// export is an Export with what every connection to it shares.
type export struct {
	Export
	flags TransmissionFlags
	fua   blockdev.FUAWriter
	disc  blockdev.Discarder
	zero  blockdev.ZeroWriter
	ended Stats // of the connections that ended; under Server.mu
	fence fence // orders writes after the writes of connections whose peer is gone
}

// NewServer returns a server for the given exports.
func NewServer(opts Options, exports ...Export) (*Server, error) {
	o := opts.withDefaults()
	s := &Server{
		opts:      o,
		pool:      NewBufferPool(o.MemoryLimit),
		exports:   make(map[string]*export, len(exports)),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
	}
	for _, e := range exports {
		if e.Backend == nil {
			return nil, fmt.Errorf("nbd: export %q has no backend", e.Name)
		}
		if _, dup := s.exports[e.Name]; dup {
			return nil, fmt.Errorf("nbd: export %q given twice", e.Name)
		}
		x := &export{Export: e}
		x.fence.cond.L = &x.fence.mu
		x.fua, _ = e.Backend.(blockdev.FUAWriter)
		x.disc, _ = e.Backend.(blockdev.Discarder)
		x.zero, _ = e.Backend.(blockdev.ZeroWriter)
		x.flags = FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim |
			FlagSendWriteZeroes | FlagCanMultiConn
		if e.ReadOnly {
			x.flags |= FlagReadOnly
		}
		s.exports[e.Name] = x
	}
	return s, nil
}

// size is the export's size now: the backend's, which grows with an online expansion.
func (x *export) size() int64 { return x.Backend.Size() }

// ExportInfo is what a client learns about an export in the handshake.
type ExportInfo struct {
	Size  int64
	Flags TransmissionFlags
}

// Info returns an export's size now and its transmission flags (for the kernel attach, which
// gets them from netlink instead of a handshake).
func (s *Server) Info(name string) (ExportInfo, error) {
	x, ok := s.exports[name]
	if !ok {
		return ExportInfo{}, fmt.Errorf("%w: %q", ErrUnknownExport, name)
	}
	return ExportInfo{Size: x.size(), Flags: x.flags}, nil
}

// MaxRequestSize is the largest read or write the server accepts (Options.MaxRequestSize).
func (s *Server) MaxRequestSize() int { return s.opts.MaxRequestSize }

// Listen creates a unix socket with mode 0600 at path. The directory holding it must exist
// and must not be writable or searchable by group or others (0700 or stricter); a stale
// socket at path is removed.
func Listen(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("nbd: socket directory: %w", err)
	}
	if !st.IsDir() || st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v", ErrNotPrivate, dir, st.Mode().Perm())
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("nbd: remove stale socket: %w", err)
	}
	// The umask makes the socket 0600 from its creation on, with no window in which a
	// looser mode is visible; the private directory covers the rest.
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("nbd: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("nbd: chmod socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// Serve accepts connections on ln until Shutdown or Close, negotiates with each and serves
// it. It always returns a non-nil error; ErrServerClosed after Shutdown or Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("nbd: accept: %w", err)
		}
		c := s.newConn(nc)
		if c == nil {
			return ErrServerClosed
		}
		go func() {
			if err := c.negotiate(); err != nil {
				s.release(c)
				if !errors.Is(err, errAborted) && !isClosed(err) {
					klog.V(2).InfoS("NBD negotiation ended", "err", err)
				}
				return
			}
			if err := c.transmit(); err != nil && !isClosed(err) {
				klog.V(2).InfoS("NBD connection ended", "export", c.exp.Name, "err", err)
			}
		}()
	}
}

// ServeAttached serves nc, the server end of a socket whose other end the kernel got through
// netlink: the handshake is skipped and the transmission phase starts at once. It returns
// when the connection ends: when the kernel gave up on the socket, at once, even if requests
// of it are still in the backend (they finish in the background, see fence.go), so that the
// caller can hand the kernel a new socket.
func (s *Server) ServeAttached(nc net.Conn, exportName string) error {
	h, err := s.ServeKernel(nc, exportName, nil)
	if h != nil { // HandOver took it, but this caller cannot pass it on
		_ = h.Conn.Close()
		return ErrServerClosed
	}
	return err
}

func (s *Server) newConn(nc net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		_ = nc.Close()
		return nil
	}
	c := &conn{srv: s, nc: nc}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return c
}

func (s *Server) release(c *conn) {
	if !c.keep {
		_ = c.nc.Close()
	}
	s.mu.Lock()
	delete(s.conns, c)
	if c.counted != nil {
		c.wmu.Lock()
		c.counted.ended.add(&c.stats)
		c.wmu.Unlock()
	}
	s.mu.Unlock()
	s.wg.Done()
}

// Shutdown stops accepting, lets every connection finish the requests it has read and send
// their replies, then closes the connections. If ctx ends first, the connections are closed
// at once and ctx's error is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for c := range s.conns {
		c.drain()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		_ = s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes every listener and connection at once, without draining.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for c := range s.conns {
		_ = c.nc.Close()
	}
	s.mu.Unlock()
	s.pool.Close()
	return nil
}
