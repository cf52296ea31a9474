package kernel

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// growingFile is a file backend whose visible size a test raises, as a RAID10 array's
// grows during an online expansion.
type growingFile struct {
	*nbd.FileBackend
	size atomic.Int64
}

func (g *growingFile) Size() int64 { return g.size.Load() }

// TestInKernelResize grows an attached device under a mounted ext4 while a writer fsyncs:
// Attacher.Resize (NBD_CMD_RECONFIGURE with NBD_ATTR_SIZE_BYTES) must change the device's
// size in place on this kernel, resize2fs must grow the mounted filesystem into it, the
// writer must see no error and the data must read back.
func TestInKernelResize(t *testing.T) {
	inGuest(t)
	dir := t.TempDir()
	const small, large = 96 << 20, 224 << 20
	fb, err := nbd.OpenFileBackend(filepath.Join(dir, "disk.img"), 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	g := &growingFile{FileBackend: fb}
	g.size.Store(small)
	srv, err := nbd.NewServer(nbd.Options{}, nbd.Export{Name: "vol", Backend: g})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	nl, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	st, err := OpenState(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	a := NewAttacher(srv, nl, st, Options{Connections: 2, Timeout: 10 * time.Second, DeadConnTimeout: 60 * time.Second})
	d, err := a.Attach("vol-resize", "vol")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Detach("vol-resize") }()
	if got := vm.BlockSize(t, d.Path()); got != small {
		t.Fatalf("attached %s has %d bytes, want %d", d.Path(), got, small)
	}
	if _, err := a.Resize("vol-other"); !errors.Is(err, ErrNotAttached) {
		t.Fatalf("Resize of a volume not attached: %v, want ErrNotAttached", err)
	}

	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	vm.Sh(t, "mkfs.ext4", "-q", "-F", d.Path())
	vm.Sh(t, "mount", d.Path(), mnt)
	defer vm.Sh(t, "umount", mnt)
	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(mnt, "before"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	var before unix.Statfs_t
	if err := unix.Statfs(mnt, &before); err != nil {
		t.Fatal(err)
	}

	// A writer appends and fsyncs across the resize.
	stop := make(chan struct{})
	werr := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(filepath.Join(mnt, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			werr <- err
			return
		}
		defer f.Close()
		rec := bytes.Repeat([]byte{0x5a}, 4096)
		for {
			select {
			case <-stop:
				werr <- nil
				return
			default:
			}
			if _, err := f.Write(rec); err != nil {
				werr <- err
				return
			}
			if err := f.Sync(); err != nil {
				werr <- err
				return
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)

	g.size.Store(large)
	start := time.Now()
	got, err := a.Resize("vol-resize")
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	t.Logf("Resize to %d bytes took %s", got, time.Since(start).Round(time.Millisecond))
	if got != large {
		t.Fatalf("Resize reports %d bytes, want %d", got, large)
	}
	if n := vm.BlockSize(t, d.Path()); n != large {
		t.Fatalf("BLKGETSIZE64 after the resize: %d, want %d", n, large)
	}
	if again, err := a.Resize("vol-resize"); err != nil || again != large {
		t.Fatalf("second Resize: %d %v, want %d (no-op)", again, err, large)
	}
	vm.Sh(t, "resize2fs", d.Path())
	close(stop)
	if err := <-werr; err != nil {
		t.Fatalf("writer across the resize: %v", err)
	}
	var after unix.Statfs_t
	if err := unix.Statfs(mnt, &after); err != nil {
		t.Fatal(err)
	}
	b0, b1 := int64(before.Blocks)*before.Bsize, int64(after.Blocks)*after.Bsize
	t.Logf("filesystem: %d -> %d bytes", b0, b1)
	if b1 < b0+(large-small)*9/10 {
		t.Fatalf("filesystem grew from %d to %d bytes; the device grew by %d", b0, b1, large-small)
	}
	// Fill past the old end of the device and read everything back.
	big := make([]byte, 120<<20)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(mnt, "after"), big, 0o644); err != nil {
		t.Fatalf("write 120 MiB into the grown filesystem: %v", err)
	}
	vm.Sh(t, "sync")
	vm.Sh(t, "sh", "-c", "echo 3 > /proc/sys/vm/drop_caches")
	for name, want := range map[string][]byte{"before": data, "after": big} {
		b, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("%s reads back wrong (%v)", name, err)
		}
	}

	g.size.Store(small)
	if _, err := a.Resize("vol-resize"); !errors.Is(err, ErrShrink) {
		t.Fatalf("Resize to a smaller export: %v, want ErrShrink", err)
	}
	g.size.Store(large)
}
