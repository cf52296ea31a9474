package raid10

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// extentMembers returns n extents of length bytes at offset 0 of n sparse
// files of base bytes (closed at the end of the test).
func extentMembers(t *testing.T, n int, base, length int64) (bases []Member, exts []*ExtentMember) {
	t.Helper()
	bases = fileMembers(t, n, base)
	t.Cleanup(func() {
		for _, b := range bases {
			b.Close()
		}
	})
	for _, b := range bases {
		e, err := NewExtentMember(b, 0, length)
		if err != nil {
			t.Fatal(err)
		}
		exts = append(exts, e)
	}
	return bases, exts
}

func asMembers(exts []*ExtentMember) []Member {
	ms := make([]Member, len(exts))
	for i, e := range exts {
		ms[i] = e
	}
	return ms
}

func TestGrow(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const mi = 1 << 20
			bases, exts := extentMembers(t, n, 64*mi, 5*mi)
			a, err := Create(asMembers(exts), CreateOptions{Options: testOpts(), ChunkSize: testChunk, RegionSize: 256 << 10, AssumeClean: true})
			if err != nil {
				t.Fatal(err)
			}
			oldSize := a.Size()
			rng := rand.New(rand.NewPCG(uint64(n), 1))
			before := make([]byte, oldSize)
			fillRand(rng, before)
			if _, err := a.WriteAt(before, 0); err != nil {
				t.Fatal(err)
			}
			// Members too small: refused, nothing changes.
			newSize := oldSize + int64(n)*3*mi + 12<<10 // not chunk aligned
			if err := a.Grow(newSize); !errors.Is(err, ErrMemberTooSmall) {
				t.Fatalf("grow with small members: %v", err)
			}
			if err := a.Grow(oldSize - BlockSize); !errors.Is(err, ErrInvalid) {
				t.Fatalf("shrink: %v", err)
			}
			if err := a.Grow(oldSize); err != nil {
				t.Fatalf("same size: %v", err)
			}
			for _, e := range exts {
				if err := e.Resize(12 * mi); err != nil {
					t.Fatal(err)
				}
			}
			if err := exts[0].Resize(65 * mi); err == nil {
				t.Fatal("resize beyond the base accepted")
			}
			// The superblocks of the last member before the grow: put back
			// after Close, they stand for a crash while Grow wrote them.
			oldSB := make([]byte, 2*sbSize)
			if _, err := bases[n-1].ReadAt(oldSB, 0); err != nil {
				t.Fatal(err)
			}
			if err := a.Grow(newSize); err != nil {
				t.Fatal(err)
			}
			if a.Size() != newSize || a.Status().Size != newSize {
				t.Fatalf("size %d, want %d", a.Size(), newSize)
			}
			got := make([]byte, newSize)
			if _, err := a.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:oldSize], before) {
				t.Fatal("data before the old end changed")
			}
			if !bytes.Equal(got[oldSize:], make([]byte, newSize-oldSize)) {
				t.Fatal("new range does not read as zeroes")
			}
			after := make([]byte, newSize-oldSize)
			fillRand(rng, after)
			if _, err := a.WriteAt(after, oldSize); err != nil {
				t.Fatal(err)
			}
			res, err := a.Check(context.Background())
			if err != nil || res.Mismatches != 0 || res.Checked != newSize {
				t.Fatalf("check: %+v %v", res, err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if n == 2 {
				if _, err := bases[n-1].WriteAt(oldSB, 0); err != nil {
					t.Fatal(err)
				}
			}
			var ms []Member
			for _, b := range bases {
				e, err := NewExtentMember(b, 0, 12*mi)
				if err != nil {
					t.Fatal(err)
				}
				ms = append(ms, e)
			}
			b, err := Assemble(ms, AssembleOptions{Options: testOpts()})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if err := b.WaitSync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if b.Size() != newSize || b.State() != ArrayOptimal {
				t.Fatalf("reassembled: size %d state %v", b.Size(), b.State())
			}
			if _, err := b.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:oldSize], before) || !bytes.Equal(got[oldSize:], after) {
				t.Fatal("data differs after reassembly")
			}
			res, err = b.Check(context.Background())
			if err != nil || res.Mismatches != 0 {
				t.Fatalf("check after reassembly: %+v %v", res, err)
			}
		})
	}
}

// TestGrowBitmapSpace: the bitmap grows within the space before the data
// offset, and a growth it cannot cover is refused.
func TestGrowBitmapSpace(t *testing.T) {
	const mi = 1 << 20
	_, exts := extentMembers(t, 2, 256*mi, 3*mi)
	// 4 KiB regions: one bitmap block covers ~128 MiB of array.
	a, err := Create(asMembers(exts), CreateOptions{Options: testOpts(), ChunkSize: BlockSize, RegionSize: BlockSize, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, e := range exts {
		if err := e.Resize(256 * mi); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Grow(200 * mi); err != nil {
		t.Fatal(err)
	}
	if a.bm.dirtyCount() != 0 || int64(len(a.bm.states())) != 200*mi/BlockSize {
		t.Fatalf("bitmap: %d regions, %d dirty", len(a.bm.states()), a.bm.dirtyCount())
	}
	p := AlignedBuffer(BlockSize)
	p[0] = 7
	if _, err := a.WriteAt(p, 200*mi-BlockSize); err != nil {
		t.Fatal(err)
	}
	if a.bm.dirtyCount() != 1 {
		t.Fatalf("dirty regions after a write in the new range: %d", a.bm.dirtyCount())
	}
	// 40 GiB of 4 KiB regions need more bitmap than the 1 MiB data offset leaves.
	if err := a.Grow(40 << 30); !errors.Is(err, ErrInvalid) {
		t.Fatalf("grow beyond the bitmap space: %v", err)
	}
}

// TestGrowUnderIO grows an array several times while readers and writers
// run (meant for -race): every block keeps the last value written.
func TestGrowUnderIO(t *testing.T) {
	const mi = 1 << 20
	_, exts := extentMembers(t, 3, 32*mi, 2*mi)
	a, err := Create(asMembers(exts), CreateOptions{Options: testOpts(), ChunkSize: testChunk, RegionSize: 128 << 10, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, e := range exts {
		if err := e.Resize(32 * mi); err != nil {
			t.Fatal(err)
		}
	}
	const workers = 4
	stop := make(chan struct{})
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			buf := AlignedBuffer(BlockSize)
			rd := AlignedBuffer(BlockSize)
			for {
				select {
				case <-stop:
					errc <- nil
					return
				default:
				}
				// Each worker owns the blocks b with b%workers == w.
				blocks := a.Size() / BlockSize / workers
				off := (rng.Int64N(blocks)*workers + int64(w)) * BlockSize
				for i := range buf {
					buf[i] = byte(off>>12) ^ byte(w)
				}
				if _, err := a.WriteAt(buf, off); err != nil {
					errc <- err
					return
				}
				if _, err := a.ReadAt(rd, off); err != nil {
					errc <- err
					return
				}
				if !bytes.Equal(rd, buf) {
					errc <- fmt.Errorf("block at %d: read back differs", off)
					return
				}
				_ = a.Status()
			}
		}()
	}
	size := a.Size()
	for range 5 {
		time.Sleep(20 * time.Millisecond)
		size += 3 * mi
		if err := a.Grow(size); err != nil {
			t.Error(err)
			break
		}
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	res, err := a.Check(context.Background())
	if err != nil || res.Mismatches != 0 || res.Checked != size {
		t.Fatalf("check: %+v %v", res, err)
	}
}

func TestGrowRefusedWhenDegraded(t *testing.T) {
	const mi = 1 << 20
	_, exts := extentMembers(t, 2, 16*mi, 4*mi)
	a, err := Create(asMembers(exts), CreateOptions{Options: testOpts(), ChunkSize: testChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, e := range exts {
		if err := e.Resize(8 * mi); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.FailMember(1); err != nil {
		t.Fatal(err)
	}
	if err := a.Grow(a.Size() + mi); !errors.Is(err, ErrBusy) {
		t.Fatalf("grow degraded: %v", err)
	}
}

// TestGrowWithinMembers: an array created smaller than its members grows
// into the rows it already has (no member resize); the new range reads as
// zeroes on both copies even where the members held other data.
func TestGrowWithinMembers(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const mi = 1 << 20
			ms := fileMembers(t, n, 6*mi)
			// Garbage where the grown range will be.
			junk := bytes.Repeat([]byte{0xee}, 4*mi)
			for _, m := range ms {
				if _, err := m.WriteAt(junk, 2*mi); err != nil {
					t.Fatal(err)
				}
			}
			oldSize := int64(mi + 20<<10) // ends inside a chunk
			a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, Size: oldSize, AssumeClean: true})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			data := bytes.Repeat([]byte{0x11}, int(oldSize))
			if _, err := a.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			newSize := int64(n) * 5 * mi / 2
			if err := a.Grow(newSize); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, newSize)
			if _, err := a.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:oldSize], data) || !bytes.Equal(got[oldSize:], make([]byte, newSize-oldSize)) {
				t.Fatal("grown array: old data changed or new range not zero")
			}
			res, err := a.Check(context.Background())
			if err != nil || res.Mismatches != 0 || res.Checked != newSize {
				t.Fatalf("check: %+v %v", res, err)
			}
			if err := a.Grow(newSize + testChunk); !errors.Is(err, ErrMemberTooSmall) || !bytes.Contains([]byte(err.Error()), []byte("slot 0")) {
				t.Fatalf("grow past the members: %v", err)
			}
		})
	}
}
