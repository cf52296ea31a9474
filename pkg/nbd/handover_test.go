package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math/rand"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// kernelPair returns the two ends of a unix socketpair as the kernel attach has them: the
// server's and the client's (standing in for the kernel).
func kernelPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// TestHandOverKeepsTheStream hands one kernel connection from server to server every few
// milliseconds while a client streams writes into it in pieces of random size (so that
// handovers fall inside headers and payloads), then reads every block back through the last
// server: each request is answered exactly once, without error, and every write landed.
func TestHandOverKeepsTheStream(t *testing.T) {
	const blocks = 3000
	be := newMemBackend(blocks*8192 + 8192)
	sc, cc := kernelPair(t)
	defer cc.Close()
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)

	size := func(h uint64) uint32 { return uint32(4096 * (1 + h%2)) } // 4 KiB and 8 KiB
	data := func(h uint64) []byte {
		b := make([]byte, size(h))
		for i := range b {
			b[i] = byte(h*7 + uint64(i)/512)
		}
		return b
	}
	var stream bytes.Buffer
	for h := uint64(0); h < blocks; h++ {
		var hdr [requestHeaderSize]byte
		binary.BigEndian.PutUint32(hdr[0:], magicRequest)
		binary.BigEndian.PutUint16(hdr[6:], uint16(CmdWrite))
		binary.BigEndian.PutUint64(hdr[8:], h)
		binary.BigEndian.PutUint64(hdr[16:], 512+h*8192) // never 1 MiB, where memBackend fails
		binary.BigEndian.PutUint32(hdr[24:], size(h))
		stream.Write(hdr[:])
		stream.Write(data(h))
	}
	go func() { // the kernel's sends, cut anywhere
		b := stream.Bytes()
		for len(b) > 0 {
			n := min(len(b), 1+rand.Intn(20000)) // its own source: rng is the test goroutine's
			if _, err := cc.Write(b[:n]); err != nil {
				return
			}
			b = b[n:]
		}
	}()
	replies := make(map[uint64]int)
	var mu sync.Mutex
	repliesDone := make(chan error, 1)
	go func() {
		var h [replyHeaderSize]byte
		for i := 0; i < blocks; i++ {
			if _, err := io.ReadFull(cc, h[:]); err != nil {
				repliesDone <- err
				return
			}
			if binary.BigEndian.Uint32(h[0:]) != magicReply || binary.BigEndian.Uint32(h[4:]) != 0 {
				t.Errorf("reply %x", h)
			}
			mu.Lock()
			replies[binary.BigEndian.Uint64(h[8:])]++
			mu.Unlock()
		}
		repliesDone <- nil
	}()

	conn, unread := sc, []byte(nil)
	handovers, withUnread := 0, 0
	var last *Server
	for done := false; !done; {
		srv, err := NewServer(Options{}, Export{Name: "", Backend: be})
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			h   *Handoff
			err error
		}
		res := make(chan result, 1)
		go func() { h, err := srv.ServeKernel(conn, "", unread); res <- result{h, err} }()
		select {
		case err := <-repliesDone:
			if err != nil {
				t.Fatal(err)
			}
			done = true
			last = srv
			continue
		case <-time.After(time.Duration(rng.Intn(3000)) * time.Microsecond):
		}
		if err := srv.HandOver(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := <-res
		if r.err != nil || r.h == nil {
			t.Fatalf("handover %d: %v %v", handovers, r.h, r.err)
		}
		_ = srv.Close()
		conn, unread = r.h.Conn, r.h.Unread
		handovers++
		if len(unread) > 0 {
			withUnread++
		}
	}
	t.Logf("%d handovers, %d with unread bytes", handovers, withUnread)
	for h := uint64(0); h < blocks; h++ {
		if replies[h] != 1 {
			t.Fatalf("handle %d answered %d times", h, replies[h])
		}
		if got := be.data[512+h*8192 : 512+h*8192+uint64(size(h))]; !bytes.Equal(got, data(h)) {
			t.Fatalf("block %d holds other data", h)
		}
	}
	_ = last.Close()
	if handovers < 10 {
		t.Fatalf("only %d handovers", handovers)
	}
}
