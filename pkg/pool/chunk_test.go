package pool

import (
	"errors"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestChunkSize: CreateOptions.ChunkSize reaches the engine (the array and, after a reopen,
// its superblocks say so), is validated with an error naming it, is part of the idempotency
// of CreateVolume, and sizes the extents of a later expansion.
func TestChunkSize(t *testing.T) {
	dir := t.TempDir()
	cfg := configFor(makeDisks(t, dir, 4, testDiskSize)...)
	p := openPool(t, cfg)
	for _, c := range []struct {
		name  string
		chunk int64
	}{
		{"below 4 KiB", 2 << 10},
		{"not a power of two", 96 << 10},
		{"above 16 MiB", 32 << 20},
		{"negative", -4096},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := p.CreateVolume("bad", 8<<20, CreateOptions{ChunkSize: c.chunk})
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "chunk size") {
				t.Fatalf("chunk size %d: %v, want ErrInvalidArgument naming the chunk size", c.chunk, err)
			}
		})
	}
	if _, err := p.Volume("bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused volume exists: %v", err)
	}

	def, err := p.CreateVolume("cdef", 8<<20, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vi, err := p.CreateVolume("c64", 8<<20, CreateOptions{ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if def.ChunkSize != raid10.DefaultChunkSize || vi.ChunkSize != 64<<10 {
		t.Fatalf("chunk sizes: default volume %d, 64Ki volume %d", def.ChunkSize, vi.ChunkSize)
	}
	if a, _ := p.Array("c64"); a.ChunkSize() != 64<<10 {
		t.Fatalf("array chunk size %d, want %d", a.ChunkSize(), 64<<10)
	}
	if _, err := p.CreateVolume("c64", 8<<20, CreateOptions{ChunkSize: 128 << 10}); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("same name, other chunk size: %v, want ErrAlreadyExists", err)
	}
	for _, c := range []int64{0, 64 << 10} {
		if _, err := p.CreateVolume("c64", 8<<20, CreateOptions{ChunkSize: c}); err != nil {
			t.Fatalf("same name, chunk size %d: %v", c, err)
		}
	}
	// c64 is the last volume: it grows in place, keeping its chunk size.
	if vi, err = p.ExpandVolume("c64", 40<<20); err != nil || vi.Size != 40<<20 || vi.ChunkSize != 64<<10 {
		t.Fatalf("expand: %+v %v", vi, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// The chunk size comes back from the superblocks.
	p = openPool(t, cfg)
	defer p.Close()
	for name, want := range map[string]uint64{"cdef": raid10.DefaultChunkSize, "c64": 64 << 10} {
		if vi, err := p.Volume(name); err != nil || vi.ChunkSize != want || vi.Health != Healthy {
			t.Fatalf("%s after reopen: %+v %v, want chunk size %d", name, vi, err, want)
		}
	}
}
