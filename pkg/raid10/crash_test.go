package raid10

import (
	"bytes"
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

// blockHist is what a block may hold after the crash: its value at the
// writer's last completed flush, and every value written since.
type blockHist struct {
	durable []byte
	since   [][]byte
}

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
	nblocks := a.Size() / BlockSize
	hist := make([]blockHist, nblocks)
	for i := range hist {
		hist[i].durable = make([]byte, BlockSize)
	}
	const writers = 4
	per := nblocks / writers
	var crashed atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)+1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			lo := int64(w) * per
			var touched []int64
			for !crashed.Load() {
				if wrng.IntN(6) == 0 {
					// Everything this writer got acknowledged is durable
					// once Flush returns.
					snap := make([][]byte, len(touched))
					for i, b := range touched {
						if n := len(hist[b].since); n > 0 {
							snap[i] = hist[b].since[n-1]
						}
					}
					if err := a.Flush(); err != nil {
						return
					}
					for i, b := range touched {
						if snap[i] != nil {
							hist[b].durable = snap[i]
							hist[b].since = hist[b].since[:0]
						}
					}
					touched = touched[:0]
					continue
				}
				b := lo + wrng.Int64N(per)
				l := min(lo+per-b, 1+wrng.Int64N(8))
				p := make([]byte, l*BlockSize)
				fillRand(wrng, p)
				for i := int64(0); i < l; i++ { // may be written (or not) before the ack
					hist[b+i].since = append(hist[b+i].since, p[i*BlockSize:(i+1)*BlockSize])
				}
				if wrng.IntN(5) == 0 {
					// A FUA write is durable when acknowledged.
					if _, err := a.WriteAtFUA(p, b*BlockSize); err != nil {
						return
					}
					for i := int64(0); i < l; i++ {
						hist[b+i].durable = p[i*BlockSize : (i+1)*BlockSize]
						hist[b+i].since = hist[b+i].since[:0]
					}
					continue
				}
				if _, err := a.WriteAt(p, b*BlockSize); err != nil {
					return
				}
				for i := int64(0); i < l; i++ {
					touched = append(touched, b+i)
				}
			}
		}()
	}
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
	got := make([]byte, b.Size())
	if _, err := b.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range hist {
		g := got[int64(i)*BlockSize : int64(i+1)*BlockSize]
		ok := bytes.Equal(g, hist[i].durable)
		for _, v := range hist[i].since {
			ok = ok || bytes.Equal(g, v)
		}
		if !ok {
			t.Fatalf("block %d holds data never written there (durable match %v, %d later writes); status %+v",
				i, bytes.Equal(g, hist[i].durable), len(hist[i].since), b.Status())
		}
		if len(hist[i].since) == 0 && !bytes.Equal(g, hist[i].durable) {
			t.Fatalf("block %d lost a flushed write", i)
		}
	}
	res, err := b.Check(ctx)
	if err != nil || res.Mismatches != 0 {
		t.Fatalf("check after resync: %+v %v", res, err)
	}
}
