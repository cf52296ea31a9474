package raid10

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

const testChunk = 64 << 10

// testOpts keeps background work fast and unthrottled in tests.
func testOpts() Options {
	return Options{SyncRateMin: 1 << 40, SyncRateMax: -1, BitmapClearDelay: 50 * time.Millisecond}
}

// fileMembers creates n sparse files of size bytes in t.TempDir.
func fileMembers(t testing.TB, n int, size int64) []Member {
	t.Helper()
	dir := t.TempDir()
	ms := make([]Member, n)
	for i := range ms {
		p := filepath.Join(dir, "m"+string(rune('0'+i)))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		m, err := OpenFileMember(p)
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = m
	}
	return ms
}

func TestNearLayout(t *testing.T) {
	// Expected placements from md's near=2 layout.
	cases := []struct {
		name string
		n    int
		want [][4]int64 // chunk -> d0, row0, d1, row1
	}{
		{"two", 2, [][4]int64{{0, 0, 1, 0}, {0, 1, 1, 1}}},
		{"three", 3, [][4]int64{{0, 0, 1, 0}, {2, 0, 0, 1}, {1, 1, 2, 1}, {0, 2, 1, 2}, {2, 2, 0, 3}}},
		{"four", 4, [][4]int64{{0, 0, 1, 0}, {2, 0, 3, 0}, {0, 1, 1, 1}, {2, 1, 3, 1}}},
		{"five", 5, [][4]int64{{0, 0, 1, 0}, {2, 0, 3, 0}, {4, 0, 0, 1}, {1, 1, 2, 1}, {3, 1, 4, 1}, {0, 2, 1, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newGeometry(tc.n, testChunk, 1<<20, 100*testChunk, 10*testChunk, testChunk, 4096)
			for c, w := range tc.want {
				d0, d1, o0, o1 := g.mapChunk(int64(c))
				got := [4]int64{int64(d0), (o0 - (1 << 20)) / testChunk, int64(d1), (o1 - (1 << 20)) / testChunk}
				if got != w {
					t.Errorf("chunk %d: got %v, want %v", c, got, w)
				}
			}
		})
	}
}

func TestCreateWriteReadAssemble(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5} {
		t.Run(string(rune('0'+n)), func(t *testing.T) {
			ms := fileMembers(t, n, 8<<20)
			opts := testOpts()
			opts.BitmapClearDelay = time.Minute // real files: no fdatasync churn
			a, err := Create(ms, CreateOptions{Options: opts, ChunkSize: testChunk, AssumeClean: true})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			data := make([]byte, a.Size())
			for i := 0; i < 50; i++ {
				off := rng.Int64N(a.Size()/BlockSize) * BlockSize
				l := min(a.Size()-off, (1+rng.Int64N(40))*BlockSize)
				p := data[off : off+l]
				fillRand(rng, p)
				if _, err := a.WriteAt(p, off); err != nil {
					t.Fatal(err)
				}
			}
			got := make([]byte, a.Size())
			if _, err := a.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("read back differs")
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			// Reopen the files (Close closed them) in reverse order.
			var ms2 []Member
			for i := n - 1; i >= 0; i-- {
				m, err := OpenFileMember(ms[i].(*FileMember).Path())
				if err != nil {
					t.Fatal(err)
				}
				ms2 = append(ms2, m)
			}
			b, err := Assemble(ms2, AssembleOptions{Options: testOpts()})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if st := b.Status(); st.State != ArrayOptimal || st.Sync.Running {
				t.Fatalf("status after clean assemble: %+v", st)
			}
			clear(got)
			if _, err := b.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("read back after assemble differs")
			}
			res, err := b.Check(context.Background())
			if err != nil || res.Mismatches != 0 {
				t.Fatalf("check: %+v %v", res, err)
			}
		})
	}
}

func fillRand(rng *rand.Rand, p []byte) {
	for i := 0; i+8 <= len(p); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
}

func TestErrorsMatchErrno(t *testing.T) {
	a, err := Create([]Member{NewMemMember(4 << 20), NewMemMember(4 << 20)}, CreateOptions{Options: testOpts(), ChunkSize: testChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.ReadAt(make([]byte, 100), 0); !errors.Is(err, syscall.EINVAL) || !errors.Is(err, ErrInvalid) {
		t.Errorf("misaligned read: %v", err)
	}
	if _, err := a.WriteAt(make([]byte, BlockSize), a.Size()); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("write past the end: %v", err)
	}
}

func TestFailoverAndRecovery(t *testing.T) {
	base := []Member{NewMemMember(8 << 20), NewMemMember(8 << 20), NewMemMember(8 << 20), NewMemMember(8 << 20)}
	fs := make([]*FaultyMember, len(base))
	ms := make([]Member, len(base))
	for i := range base {
		fs[i] = NewFaultyMember(base[i])
		ms[i] = fs[i]
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, RegionSize: testChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rng := rand.New(rand.NewPCG(2, 2))
	data := make([]byte, a.Size())
	fillRand(rng, data)
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	fs[1].FailReadsAfter(3)
	fs[2].FailWritesAfter(0)
	// Writes keep working: member 2 fails, its partner 3 takes them.
	fillRand(rng, data[:1<<20])
	if _, err := a.WriteAt(data[:1<<20], 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	for i := 0; i < 3; i++ {
		if _, err := a.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("read differs after faults")
		}
	}
	st := a.Status()
	if st.State != ArrayDegraded || st.Members[2].State != MemberFaulty {
		t.Fatalf("want degraded with member 2 faulty: %+v", st)
	}
	// Member 1's read errors were fixed by rewriting, or it failed too.
	if st.Members[1].ReadErrors == 0 {
		t.Errorf("no read errors counted on member 1")
	}
	fs[1].ClearFaults()
	// Replace member 2 with a fresh one; foreground writes go on meanwhile.
	if st.Members[1].State != MemberInSync {
		if err := a.ReplaceMember(1, NewMemMember(8<<20)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ReplaceMember(2, NewMemMember(8<<20)); err != nil {
		t.Fatal(err)
	}
	fillRand(rng, data[2<<20:3<<20])
	if _, err := a.WriteAt(data[2<<20:3<<20], 2<<20); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.WaitSync(ctx); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); st.State != ArrayOptimal {
		t.Fatalf("after recovery: %+v", st)
	}
	// Both copies now agree and hold the data.
	res, err := a.Check(ctx)
	if err != nil || res.Mismatches != 0 {
		t.Fatalf("check: %+v %v", res, err)
	}
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after recovery: %v", err)
	}
	// Both copies of chunk 0 gone: the array fails and I/O there errors.
	if err := a.FailMember(1); err != nil {
		t.Fatal(err)
	}
	fs[0].Disappear()
	if _, err := a.ReadAt(got[:BlockSize], 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read with both copies gone: %v", err)
	}
	if a.State() != ArrayFailed {
		t.Fatalf("state %v, want failed", a.State())
	}
}

// TestRecoveryRateAndProgress checks the rate ceiling and that progress,
// rate and ETA are reported while a recovery runs.
// TestRecoveryRateAndProgress checks the recovery's ceiling (SyncRateMax)
// and its progress, with small chunks and with 512 KiB ones under a ceiling
// below one chunk per 200 ms (the throttle's longest single sleep).
func TestRecoveryRateAndProgress(t *testing.T) {
	for _, tc := range []struct {
		chunk, ceiling int64
	}{{testChunk, 4 << 20}, {512 << 10, 1 << 20}} {
		t.Run(fmt.Sprintf("chunk%dk", tc.chunk>>10), func(t *testing.T) { recoveryRate(t, tc.chunk, tc.ceiling) })
	}
}

func recoveryRate(t *testing.T, chunk, ceiling int64) {
	ms := []Member{NewMemMember(4 << 20), NewMemMember(4 << 20)}
	a, err := Create(ms, CreateOptions{
		Options:   Options{SyncRateMin: 1 << 20, SyncRateMax: ceiling, BitmapClearDelay: time.Hour},
		ChunkSize: chunk, AssumeClean: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.FailMember(1); err != nil {
		t.Fatal(err)
	}
	if err := a.FailMember(0); !errors.Is(err, ErrLastCopy) {
		t.Fatalf("failing the last copy: %v", err)
	}
	start := time.Now()
	if err := a.ReplaceMember(1, NewMemMember(4<<20)); err != nil {
		t.Fatal(err)
	}
	if err := a.ReplaceMember(1, NewMemMember(4<<20)); !errors.Is(err, ErrSlotInUse) {
		t.Fatalf("replacing a recovering slot: %v", err)
	}
	var seen SyncProgress
	for {
		st := a.Status()
		if st.Sync.Running && st.Sync.Kind == SyncRecovery && st.Sync.Done > 0 && st.Sync.Done < st.Sync.Total {
			seen = st.Sync
		}
		if st.State == ArrayOptimal {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	el := time.Since(start)
	total := a.Size()
	if min := time.Duration(float64(total) / float64(ceiling) * 0.8 * float64(time.Second)); el < min {
		t.Errorf("recovery of %d bytes took %v, the ceiling allows no less than %v", total, el, min)
	}
	if seen.Total != total || seen.Rate <= 0 || seen.ETA <= 0 {
		t.Errorf("progress while running: %+v", seen)
	}
	t.Logf("recovered %d bytes in %v; sample %+v", total, el, seen)
}
