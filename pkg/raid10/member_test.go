package raid10

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

func TestFileMemberDirectFallback(t *testing.T) {
	cases := []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"tmpfs", func(t *testing.T) string {
			d, err := os.MkdirTemp("/dev/shm", "raid10-test-")
			if err != nil {
				testenv.Missing(t, "no /dev/shm: %v", err)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}},
		{"tempdir", func(t *testing.T) string { return t.TempDir() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(tc.dir(t), "m")
			if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			m, err := OpenFileMember(p)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			t.Logf("direct I/O: %v", m.Direct())
			// Unaligned memory goes through a bounce buffer.
			raw := make([]byte, 3*BlockSize+1)
			buf := raw[1 : 1+2*BlockSize]
			for i := range buf {
				buf[i] = byte(i)
			}
			if _, err := m.WriteAt(buf, BlockSize); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 3*BlockSize+1)[1 : 1+2*BlockSize]
			if _, err := m.ReadAt(got, BlockSize); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, buf) {
				t.Fatal("read back differs")
			}
			if err := m.WriteZeroes(BlockSize, BlockSize); err != nil {
				t.Fatal(err)
			}
			if err := m.Discard(2*BlockSize, BlockSize); err != nil {
				t.Fatal(err)
			}
			if _, err := m.ReadAt(got, BlockSize); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, make([]byte, len(got))) {
				t.Fatal("zeroed/discarded range is not zero")
			}
			if err := m.Flush(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestExtentMember(t *testing.T) {
	base := NewMemMember(1 << 20)
	if _, err := NewExtentMember(base, 100, BlockSize); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("misaligned extent: %v", err)
	}
	if _, err := NewExtentMember(base, 0, 2<<20); !errors.Is(err, ErrInvalid) {
		t.Errorf("extent past the end: %v", err)
	}
	e, err := NewExtentMember(base, 64<<10, 128<<10)
	if err != nil {
		t.Fatal(err)
	}
	p := bytes.Repeat([]byte{7}, BlockSize)
	if _, err := e.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if base.data[64<<10] != 7 || base.data[64<<10-1] != 0 {
		t.Error("extent write landed at the wrong base offset")
	}
	if _, err := e.WriteAt(p, 128<<10); err == nil {
		t.Error("write past the extent accepted")
	}
	if e.Size() != 128<<10 {
		t.Errorf("size %d", e.Size())
	}
}

func TestFaultyMemberVolatile(t *testing.T) {
	base := NewMemMember(1 << 20)
	f := NewFaultyMember(base)
	f.SetVolatile(true)
	p := bytes.Repeat([]byte{1}, BlockSize)
	_, _ = f.WriteAt(p, 0)
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	p2 := bytes.Repeat([]byte{2}, BlockSize)
	_, _ = f.WriteAt(p2, 0)
	got := make([]byte, BlockSize)
	_, _ = f.ReadAt(got, 0)
	if got[0] != 2 {
		t.Fatal("unsynced write not visible before the crash")
	}
	f.Crash(nil)
	_, _ = f.ReadAt(got, 0)
	if got[0] != 1 {
		t.Fatal("crash kept an unsynced write or lost a synced one")
	}
	f.Disappear()
	if _, err := f.ReadAt(got, 0); !errors.Is(err, ErrMemberGone) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("gone member: %v", err)
	}
}
