package nbd

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// growingBackend is a memBackend whose visible size grows, as a RAID10 array's does during an
// online expansion.
type growingBackend struct {
	*memBackend
	size atomic.Int64
}

func (g *growingBackend) Size() int64 { return g.size.Load() }

// TestExportSizeFollowsBackend: after the backend grows, a new handshake advertises the new
// size, Info reports it (the kernel attach resizes from it), and a connection opened before
// the growth may use the new range at once.
func TestExportSizeFollowsBackend(t *testing.T) {
	g := &growingBackend{memBackend: newMemBackend(4 << 20)}
	g.size.Store(1 << 20)
	srv, sock := startServer(t, Options{}, Export{Name: "", Backend: g})
	old := dialRaw(t, sock)
	if size, _ := old.goExport(""); size != 1<<20 {
		t.Fatalf("handshake before the growth: size %d, want %d", size, 1<<20)
	}
	page := bytes.Repeat([]byte{9}, 4096)
	old.request(CmdWrite, 0, 1, 2<<20, 4096, page)
	if _, errno := old.reply(); errno == ErrnoNone {
		t.Fatal("write past the old end succeeded before the growth")
	}

	g.size.Store(3 << 20)
	if info, err := srv.Info(""); err != nil || info.Size != 3<<20 {
		t.Fatalf("Info after the growth: %+v %v, want size %d", info, err, 3<<20)
	}
	if size, _ := dialRaw(t, sock).goExport(""); size != 3<<20 {
		t.Fatalf("handshake after the growth: size %d, want %d", size, 3<<20)
	}
	old.request(CmdWrite, 0, 2, 2<<20, 4096, page)
	if _, errno := old.reply(); errno != ErrnoNone {
		t.Fatalf("write in the grown range on an old connection: errno %d", errno)
	}
	old.request(CmdRead, 0, 3, 3<<20, 4096, nil)
	if _, errno := old.reply(); errno != ErrnoInval {
		t.Fatalf("read past the new end: errno %d, want EINVAL", errno)
	}
}
