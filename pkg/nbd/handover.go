package nbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// errHandedOver ends the reader of a connection that HandOver takes out of the server.
var errHandedOver = errors.New("nbd: connection handed over")

// Handoff is a connection of the kernel attach that HandOver took out of the server at a
// request boundary: every request executed from it was answered and its reply written, the
// socket is still open (the kernel's end never noticed), and Unread holds the bytes already
// read from the socket that belong to requests not executed (what the kernel sent after the
// boundary, the last one possibly cut short). The next server, in this process or another
// one, serves Unread before the socket (ServeKernel) and so sees the kernel's byte stream
// unbroken.
type Handoff struct {
	Conn   net.Conn
	Unread []byte
}

// ServeKernel serves nc, the server end of a socket whose other end the kernel got through
// netlink, as ServeAttached does, after first serving unread: bytes of nc's stream that an
// earlier server read and did not execute (Handoff.Unread; nil for a fresh socket). It returns
// when the connection ends: a Handoff and a nil error when HandOver took it out (nc is then
// left open), else nil and why it ended.
func (s *Server) ServeKernel(nc net.Conn, exportName string, unread []byte) (*Handoff, error) {
	x, ok := s.exports[exportName]
	if !ok {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: %q", ErrUnknownExport, exportName)
	}
	s.mu.Lock()
	if s.closing {
		handing := s.handing
		s.mu.Unlock()
		if handing { // HandOver came first: pass the socket on untouched
			return &Handoff{Conn: nc, Unread: unread}, nil
		}
		_ = nc.Close()
		return nil, ErrServerClosed
	}
	c := &conn{srv: s, nc: nc, exp: x, kernel: true}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	pr := &prefixed{pre: unread, Conn: nc}
	c.br = bufio.NewReaderSize(pr, readBufferSize)
	err := c.transmit() // releases c
	if !errors.Is(err, errHandedOver) {
		return nil, err
	}
	if !c.keep { // the kernel had given up on the socket: it ended like any other
		return nil, ErrServerClosed
	}
	// In stream order: the request cut short, what the buffer holds, what is left of the
	// earlier server's bytes; the socket follows.
	rest := make([]byte, 0, len(c.unread)+c.br.Buffered()+len(pr.pre))
	rest = append(rest, c.unread...)
	b, _ := c.br.Peek(c.br.Buffered())
	rest = append(rest, b...)
	rest = append(rest, pr.pre...)
	_ = nc.SetReadDeadline(time.Time{})
	return &Handoff{Conn: nc, Unread: rest}, nil
}

// HandOver stops the server for a successor: it stops accepting, makes every connection of
// the kernel attach stop reading at the next request boundary, lets every request already
// read complete and its reply reach the socket, and waits until each ServeKernel has returned
// its Handoff; connections of Serve are drained and closed as by Shutdown. If ctx ends first,
// every connection is closed (no Handoff) and ctx's error is returned.
func (s *Server) HandOver(ctx context.Context) error {
	s.mu.Lock()
	s.closing, s.handing = true, true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for c := range s.conns {
		if c.kernel {
			c.handing.Store(true)
			_ = c.nc.SetReadDeadline(time.Now()) // wakes a reader waiting for the next request
		} else {
			c.drain()
		}
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

// prefixed reads pre, then the connection.
type prefixed struct {
	pre []byte
	net.Conn
}

func (p *prefixed) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}
