package raid10

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The crash-history write model that the crash tests share (TestCrash,
// TestCopyCrash, the fault matrix, TestCrashModelDiscard): what each array
// block may hold after the writes, flushes and discards made so far, read
// with the array running or after a crash.

// blockHistory is the model of one array block.
type blockHistory struct {
	cur     []byte   // last acknowledged value; nil = zeroes
	durable []byte   // value at the last flush that covered it (crash rounds)
	since   [][]byte // values written since (acknowledged or not)
	indet   bool     // a failed write or a discard: any value, or EIO
	// discarded: a discard since the last flush or FUA write that
	// covered a later write: after a crash the block may hold whatever
	// the discard left (it may have reached the medium, the writes after
	// it not).
	discarded bool
	// For the report of a wrong block: a hash of every value written
	// (in order), and the positions of the acknowledged and durable ones
	// in it (-1: zeroes, before any write).
	hist           []uint64
	curIdx, durIdx int
}

// newHistory is the model of n blocks that hold zeroes, durably.
func newHistory(n int64) []blockHistory {
	model := make([]blockHistory, n)
	for i := range model {
		model[i].curIdx, model[i].durIdx = -1, -1
	}
	return model
}

func blockHash(p []byte) uint64 {
	if p == nil || isZero(p) {
		return 0
	}
	h := fnv.New64a()
	h.Write(p)
	return h.Sum64() | 1
}

// explain says which write of the block's history p holds.
func (b *blockHistory) explain(p []byte) string {
	h := blockHash(p)
	if h == 0 {
		return fmt.Sprintf("zeroes (acked #%d, durable #%d of %d)", b.curIdx, b.durIdx, len(b.hist))
	}
	for i := len(b.hist) - 1; i >= 0; i-- {
		if b.hist[i] == h {
			return fmt.Sprintf("write #%d (acked #%d, durable #%d of %d)", i, b.curIdx, b.durIdx, len(b.hist))
		}
	}
	return fmt.Sprintf("never written (acked #%d, durable #%d of %d)", b.curIdx, b.durIdx, len(b.hist))
}

// issue records a write of v (nil: zeroes) about to be made.
func (b *blockHistory) issue(v []byte) {
	b.since = append(b.since, v)
	b.hist = append(b.hist, blockHash(v))
}

// done records the outcome of the write issue recorded last and reports
// whether it was acknowledged.
func (b *blockHistory) done(v []byte, err error, fua bool) bool {
	if err != nil {
		b.indet = true
		return false
	}
	b.cur, b.indet = v, false
	b.curIdx = len(b.hist) - 1
	if fua {
		b.durable, b.since, b.discarded = v, b.since[:0], false
		b.durIdx = b.curIdx
	}
	return true
}

// discard records a discard: the contents are unspecified from now on,
// and after a crash until a flush covers a later write.
func (b *blockHistory) discard() { b.indet, b.discarded = true, true }

// flushed records a successful flush after the block was acknowledged
// holding snap.
func (b *blockHistory) flushed(snap []byte) {
	if !b.indet && bytes.Equal(b.cur, snap) {
		b.durable, b.since, b.discarded = snap, b.since[:0], false
		b.durIdx = b.curIdx
	}
}

// matches reports whether the block may hold p: the last acknowledged
// value while the array runs; after a crash the value at the last flush
// that covered it, or one written since.
func (b *blockHistory) matches(p []byte, crashed bool) bool {
	if b.indet {
		return true
	}
	eq := func(v []byte) bool {
		if v == nil {
			return isZero(p)
		}
		return bytes.Equal(p, v)
	}
	if !crashed {
		return eq(b.cur)
	}
	if eq(b.durable) || b.discarded {
		return true
	}
	for _, v := range b.since {
		if eq(v) {
			return true
		}
	}
	return false
}

func isZero(p []byte) bool {
	for _, c := range p {
		if c != 0 {
			return false
		}
	}
	return true
}

func oneOf(g []byte, vs [][]byte) bool {
	for _, v := range vs {
		if bytes.Equal(g, v) {
			return true
		}
	}
	return false
}

// histModel gives the model of each array block.
type histModel func(b int64) *blockHistory

// historyOf is the histModel of model.
func historyOf(model []blockHistory) histModel {
	return func(b int64) *blockHistory { return &model[b] }
}

// checkCrashed reads a, reassembled after a crash, and checks every block
// against the model: it holds its value at the last flush that covered it,
// or one written since.
func checkCrashed(t *testing.T, what string, a *Array, model histModel) {
	t.Helper()
	got := make([]byte, a.Size())
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range a.Size() / BlockSize {
		g := got[i*BlockSize : (i+1)*BlockSize]
		if m := model(i); !m.matches(g, true) {
			t.Fatalf("%s block %d holds %s: data never written there, or a flushed write lost (%d later writes); status %+v",
				what, i, m.explain(g), len(m.since), a.Status())
		}
	}
}

// histWriters runs writers over disjoint sections of the first blocks
// blocks of an array and records every write in the model; a writer stops
// at its first error (the crash). Each draws from its own generator (seed,
// stream+w): a flush one time in flushOneIn, else a write of 1 to 8 blocks
// of random data, one in five with FUA, and, if pauseOneIn is set, a pause
// of up to 200µs one time in pauseOneIn after a write.
type histWriters struct {
	a          *Array
	model      histModel
	blocks     int64
	writers    int
	seed       uint64
	stream     uint64
	flushOneIn int
	pauseOneIn int
	// around, when set, is called before each write of blocks [b, b+l)
	// and returns what is called with the write's error after it.
	around func(b, l int64, p []byte) func(err error)
}

// start starts the writers; they run until stop is set.
func (h *histWriters) start(stop *atomic.Bool, wg *sync.WaitGroup) {
	per := h.blocks / int64(h.writers)
	for w := range h.writers {
		wrng := rand.New(rand.NewPCG(h.seed, h.stream+uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.write(wrng, int64(w)*per, per, stop)
		}()
	}
}

// write is one writer over blocks [lo, lo+per).
func (h *histWriters) write(wrng *rand.Rand, lo, per int64, stop *atomic.Bool) {
	a, model := h.a, h.model
	var touched []int64
	for !stop.Load() {
		if wrng.IntN(h.flushOneIn) == 0 {
			// Everything this writer got acknowledged is durable once
			// Flush returns.
			snap := make([][]byte, len(touched))
			for i, b := range touched {
				snap[i] = model(b).cur
			}
			if err := a.Flush(); err != nil {
				return
			}
			for i, b := range touched {
				model(b).flushed(snap[i])
			}
			touched = touched[:0]
			continue
		}
		b := lo + wrng.Int64N(per)
		l := min(lo+per-b, 1+wrng.Int64N(8))
		p := make([]byte, l*BlockSize)
		fillRand(wrng, p)
		var after func(error)
		if h.around != nil {
			after = h.around(b, l, p)
		}
		for i := range l { // may be written (or not) before the ack
			model(b + i).issue(p[i*BlockSize : (i+1)*BlockSize])
		}
		// A FUA write is durable when acknowledged.
		fua := wrng.IntN(5) == 0
		var err error
		if fua {
			_, err = a.WriteAtFUA(p, b*BlockSize)
		} else {
			_, err = a.WriteAt(p, b*BlockSize)
		}
		if after != nil {
			after(err)
		}
		if err != nil {
			return
		}
		for i := range l {
			model(b+i).done(p[i*BlockSize:(i+1)*BlockSize], nil, fua)
			if !fua {
				touched = append(touched, b+i)
			}
		}
		if h.pauseOneIn > 0 && wrng.IntN(h.pauseOneIn) == 0 {
			time.Sleep(time.Duration(wrng.IntN(200)) * time.Microsecond)
		}
	}
}
