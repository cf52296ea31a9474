package raid10

import (
	"sync"
	"testing"
	"time"
)

// TestBitmapLazyClearAndReadd: bits are set by writes, cleared after the
// array has been idle, kept while a member is out, and a re-added member
// gets only the regions written while it was away.
func TestBitmapLazyClearAndReadd(t *testing.T) {
	ms := make([]Member, 4)
	for i := range ms {
		ms[i] = NewMemMember(8 << 20)
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, RegionSize: testChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := AlignedBuffer(BlockSize)
	for _, c := range []int64{0, 5, 9} {
		if _, err := a.WriteAt(p, c*testChunk); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.Status().DirtyRegions; n != 3 {
		t.Fatalf("dirty regions after 3 writes: %d", n)
	}
	waitFor(t, "bits cleared while idle", func() bool { return a.Status().DirtyRegions == 0 })

	if err := a.FailMember(2); err != nil {
		t.Fatal(err)
	}
	// Chunks 1 and 5 have a copy on member 2 (4 members: chunk c is on
	// members 2c mod 4 and 2c+1 mod 4); chunk 4 does not.
	for _, c := range []int64{1, 4, 5} {
		if _, err := a.WriteAt(p, c*testChunk); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // several sweeps: nothing may clear
	if n := a.Status().DirtyRegions; n != 3 {
		t.Fatalf("dirty regions while degraded: %d, want 3", n)
	}
	slot, err := a.AddMember(ms[2])
	if err != nil || slot != 2 {
		t.Fatalf("re-add: %d %v", slot, err)
	}
	if err := a.WaitSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := a.Status()
	if st.Sync.Kind != SyncRecovery || st.Sync.Total != 2*testChunk {
		t.Fatalf("re-add should copy the 2 dirty chunks on member 2: %+v", st.Sync)
	}
	if st.State != ArrayOptimal {
		t.Fatalf("state %v", st.State)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReadBalancing: with both copies in sync, concurrent reads of one chunk
// are spread over both members.
func TestReadBalancing(t *testing.T) {
	fs := []*FaultyMember{NewFaultyMember(NewMemMember(4 << 20)), NewFaultyMember(NewMemMember(4 << 20))}
	for _, f := range fs {
		f.SetLatency(200 * time.Microsecond)
	}
	a, err := Create([]Member{fs[0], fs[1]}, CreateOptions{Options: testOpts(), ChunkSize: testChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, BlockSize)
			for i := 0; i < 20; i++ {
				if _, err := a.ReadAt(p, 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := a.Status()
	r0, r1 := st.Members[0].ReadOps, st.Members[1].ReadOps
	if r0 < 20 || r1 < 20 {
		t.Fatalf("reads not balanced: %d and %d", r0, r1)
	}
}

func TestReqListConcurrent(t *testing.T) {
	l := newReqList(8)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := map[*wreq]bool{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				r := l.pop()
				if r == nil {
					continue
				}
				mu.Lock()
				if held[r] {
					mu.Unlock()
					t.Error("request handed out twice")
					return
				}
				held[r] = true
				mu.Unlock()
				mu.Lock()
				delete(held, r)
				mu.Unlock()
				l.push(r)
			}
		}()
	}
	wg.Wait()
	n := 0
	for l.pop() != nil {
		n++
	}
	if n != 8 {
		t.Fatalf("%d requests left, want 8", n)
	}
}
