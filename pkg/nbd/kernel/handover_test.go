package kernel

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// pairs makes n socketpairs: the server ends as Handoffs with some unread bytes each, and
// the kernel ends (as net.Conns, standing in for the kernel).
func pairs(t *testing.T, n int) ([]nbd.Handoff, []net.Conn) {
	t.Helper()
	var hs []nbd.Handoff
	var ks []net.Conn
	for i := range n {
		s, k, err := socketPair()
		if err != nil {
			t.Fatal(err)
		}
		kc, err := net.FileConn(k)
		k.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(); kc.Close() })
		hs = append(hs, nbd.Handoff{Conn: s, Unread: []byte{'u', byte('0' + i)}})
		ks = append(ks, kc)
	}
	return hs, ks
}

// checkSame checks that got are the same sockets as the kernel ends ks (a byte written to
// one arrives at the other), with the unread bytes carried over.
func checkSame(t *testing.T, got []Handed, ks []net.Conn) {
	t.Helper()
	if len(got) != 1 || got[0].VolumeID != "vol-a" || got[0].Slots != 2 || got[0].Record.Index != 7 || len(got[0].Conns) != len(ks) {
		t.Fatalf("got %+v", got)
	}
	for i, c := range got[0].Conns {
		if string(c.Unread) != string([]byte{'u', byte('0' + i)}) {
			t.Errorf("conn %d: unread %q", i, c.Unread)
		}
		if _, err := ks[i].Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		_ = c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		if _, err := io.ReadFull(c.Conn, b[:]); err != nil || b[0] != byte(i) {
			t.Fatalf("conn %d is not the kernel's peer: %v %v", i, b, err)
		}
	}
}

func privateDir(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "handover")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestHandoverProtocol passes devices from a predecessor to a successor, and through a
// Holder, over real unix sockets: the successor gets the same sockets (the kernel's peers)
// with their unread bytes; nobody listening is no handover and no error.
func TestHandoverProtocol(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := privateDir(t)

	t.Run("nobody listens", func(t *testing.T) {
		got, err := TakeHandover(ctx, filepath.Join(dir, "none.sock"), TakeOptions{})
		if got != nil || err != nil {
			t.Fatalf("TakeHandover = %v, %v; want nil, nil", got, err)
		}
		if _, err := GiveHandover(ctx, filepath.Join(dir, "none.sock"), nil); !errors.Is(err, ErrNoHolder) {
			t.Fatalf("GiveHandover = %v, want ErrNoHolder", err)
		}
	})

	t.Run("predecessor to successor", func(t *testing.T) {
		hs, ks := pairs(t, 2)
		ln, err := ListenHandover(filepath.Join(dir, HandoverSocket))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		sent := make(chan error, 1)
		go func() {
			req, err := ln.Accept()
			if err != nil {
				sent <- err
				return
			}
			devs := []Handed{{VolumeID: "vol-a", Record: Record{Index: 7, BackendID: BackendID("vol-a")}, Slots: 2, Conns: hs}}
			err = req.Send(ctx, devs)
			devs[0].Close() // the successor has its own
			sent <- err
		}()
		got, err := TakeHandover(ctx, filepath.Join(dir, HandoverSocket), TakeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		checkSame(t, got, ks)
		got[0].Close()
	})

	t.Run("refused", func(t *testing.T) {
		ln, err := ListenHandover(filepath.Join(dir, HandoverSocket))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if req, err := ln.Accept(); err == nil {
				req.Refuse()
			}
		}()
		got, err := TakeHandover(ctx, filepath.Join(dir, HandoverSocket), TakeOptions{})
		if got != nil || err != nil {
			t.Fatalf("TakeHandover from a refusing predecessor = %v, %v; want nil, nil", got, err)
		}
	})

	// A surge update: the successor starts while the predecessor serves; it is told to wait
	// and gets the devices only when the predecessor is released (told to stop).
	t.Run("successor waits for the release", func(t *testing.T) {
		hs, ks := pairs(t, 2)
		ln, err := ListenHandover(filepath.Join(dir, HandoverSocket))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		release := make(chan struct{})
		held, sent := make(chan error, 1), make(chan error, 1)
		go func() {
			req, err := ln.Accept()
			if err != nil {
				held <- err
				return
			}
			err = req.Hold(release)
			held <- err
			if err != nil {
				return
			}
			devs := []Handed{{VolumeID: "vol-a", Record: Record{Index: 7, BackendID: BackendID("vol-a")}, Slots: 2, Conns: hs}}
			err = req.Send(ctx, devs)
			devs[0].Close()
			sent <- err
		}()
		waiting := make(chan struct{})
		type result struct {
			got []Handed
			err error
		}
		took := make(chan result, 1)
		go func() {
			// The timeout bounds the steps the predecessor takes at once, not the wait.
			got, err := TakeHandover(ctx, filepath.Join(dir, HandoverSocket), TakeOptions{
				Timeout: 100 * time.Millisecond, Waiting: func() { close(waiting) }})
			took <- result{got, err}
		}()
		<-waiting
		time.Sleep(300 * time.Millisecond) // longer than the timeout: the wait goes on
		select {
		case r := <-took:
			t.Fatalf("TakeHandover returned before the release: %v, %v", r.got, r.err)
		case err := <-held:
			t.Fatalf("Hold returned before the release: %v", err)
		default:
		}
		close(release)
		if err := <-held; err != nil {
			t.Fatalf("Hold = %v after the release", err)
		}
		r := <-took
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		checkSame(t, r.got, ks)
		r.got[0].Close()
	})

	t.Run("successor gone while waiting", func(t *testing.T) {
		ln, err := ListenHandover(filepath.Join(dir, HandoverSocket))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		held := make(chan error, 1)
		go func() {
			req, err := ln.Accept()
			if err == nil {
				err = req.Hold(make(chan struct{}))
			}
			held <- err
		}()
		sctx, stop := context.WithCancel(ctx)
		got, err := TakeHandover(sctx, filepath.Join(dir, HandoverSocket), TakeOptions{Waiting: stop})
		if got != nil || !errors.Is(err, context.Canceled) || !errors.Is(err, ErrHandover) {
			t.Fatalf("TakeHandover stopped while waiting = %v, %v; want the context's error", got, err)
		}
		if err := <-held; !errors.Is(err, ErrSuccessorGone) {
			t.Fatalf("Hold = %v, want ErrSuccessorGone", err)
		}
	})

	t.Run("released without a word", func(t *testing.T) {
		ln, err := ListenHandover(filepath.Join(dir, HandoverSocket))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		release := make(chan struct{})
		go func() {
			if req, err := ln.Accept(); err == nil && req.Hold(release) == nil {
				req.Refuse() // e.g. it handed to the holder after all
			}
		}()
		got, err := TakeHandover(ctx, filepath.Join(dir, HandoverSocket), TakeOptions{Waiting: func() { close(release) }})
		if got != nil || err != nil {
			t.Fatalf("TakeHandover = %v, %v; want nil, nil", got, err)
		}
	})

	t.Run("through the holder", func(t *testing.T) {
		hs, ks := pairs(t, 2)
		h, err := ListenHolder(filepath.Join(dir, HolderSocket))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		go h.Serve()
		if got, err := TakeHandover(ctx, filepath.Join(dir, HolderSocket), TakeOptions{}); err != nil || got == nil || len(got) != 0 {
			t.Fatalf("TakeHandover from an empty holder = %v, %v; want none", got, err)
		}
		devs, err := GiveHandover(ctx, filepath.Join(dir, HolderSocket), func() ([]Handed, error) {
			return []Handed{{VolumeID: "vol-a", Record: Record{Index: 7, BackendID: BackendID("vol-a")}, Slots: 2, Conns: hs}}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i := range devs {
			devs[i].Close() // the holder has its own
		}
		if h.Held() != 1 {
			t.Fatalf("holder holds %d devices", h.Held())
		}
		got, err := TakeHandover(ctx, filepath.Join(dir, HolderSocket), TakeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkSame(t, got, ks)
		if h.Held() != 0 {
			t.Fatalf("holder still holds %d devices", h.Held())
		}
		got[0].Close()
	})
}
