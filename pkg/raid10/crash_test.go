package raid10

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCrash runs writers and flushes over members with volatile write
// caches, pulls the plug at a random moment (members vanish one by one, then
// every unsynced block is dropped or, at random, kept), reassembles, waits
// for the bitmap resync and checks that every block acknowledged before the
// writer's last completed flush (or acknowledged as a FUA write) holds that
// data, that every other block holds one of the values written to it, and
// that the copies agree.
func TestCrash(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (replay with RAID10_SEED=%d)", seed, seed)
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	for round := 0; round < rounds; round++ {
		t.Run(fmt.Sprint(round), func(t *testing.T) { crashRound(t, seed+uint64(round)) })
	}
}

// crashRound is one round of TestCrash.
func crashRound(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xc0a5))
	n := 2 + rng.IntN(3)
	bases := make([]*MemMember, n)
	fs := make([]*FaultyMember, n)
	ms := make([]Member, n)
	for i := range ms {
		bases[i] = NewMemMember(3 << 20)
		fs[i] = NewFaultyMember(bases[i])
		fs[i].SetVolatile(true)
		ms[i] = fs[i]
	}
	chunk := int64(BlockSize) << rng.IntN(3)
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: chunk, RegionSize: chunk * 2, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs { // Create's metadata is durable
		if err := f.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	model := newHistory(a.Size() / BlockSize)
	var crashed atomic.Bool
	var wg sync.WaitGroup
	w := histWriters{a: a, model: historyOf(model), blocks: int64(len(model)), writers: 4, seed: seed, stream: 1, flushOneIn: 6}
	w.start(&crashed, &wg)
	time.Sleep(time.Duration(20+rng.IntN(150)) * time.Millisecond)
	// Power loss: the members stop answering, in a random order.
	for _, i := range rng.Perm(n) {
		fs[i].Disappear()
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
	}
	crashed.Store(true)
	wg.Wait()
	for _, f := range fs {
		f.Crash(rng)
	}
	_ = a.Close() // the members are gone: only stops the goroutines

	ms2 := make([]Member, n)
	for i := range ms2 {
		ms2[i] = bases[i]
	}
	b, err := Assemble(ms2, AssembleOptions{Options: testOpts()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.WaitSync(ctx); err != nil {
		t.Fatal(err)
	}
	checkCrashed(t, "array", b, historyOf(model))
	res, err := b.Check(ctx)
	if err != nil || res.Mismatches != 0 {
		t.Fatalf("check after resync: %+v %v", res, err)
	}
}
