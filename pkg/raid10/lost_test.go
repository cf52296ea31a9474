package raid10

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestCopySourceUnavailable: both members holding some chunks of a copy's source vanish
// (a disk pulled, its mirror gone too) while the copy runs. Those blocks are unreadable
// now, not lost: the members never answered, so nothing was recorded bad on the source,
// and they read fine once the disks are back. The copy must fail rather than end ready
// with those blocks recorded lost on the target, where they would read EIO for good (pool
// soak seed 1796209337181007708: a restore ended ready with EIO holes over half its chunks
// and read "no good copy" after every disk came back).
func TestCopySourceUnavailable(t *testing.T) {
	rng := rand.New(rand.NewPCG(0x5a11, 0xab1e))
	r := newCopyRig(t, rng, false)
	defer r.src.Close()
	defer r.tgt.Close()
	prefill(t, r.src, rng)
	c, err := NewCopy(CopyConfig{Source: r.src, Target: r.tgt, Size: r.src.Size()})
	if err != nil {
		t.Fatal(err)
	}
	// The last chunk's two members vanish before the copier reaches it.
	last := r.src.Size()/r.src.geo.chunk - 1
	d0, d1, _, _ := r.src.geo.mapChunk(last)
	r.srcF[d0].Disappear()
	r.srcF[d1].Disappear()
	c.Start()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Wait(ctx)
	if err == nil {
		rec, _ := ReadCopyRecord(r.tgt)
		t.Fatalf("copy from a source whose members vanished ended without an error (record %+v); the target holds lost blocks where the source's data is only unavailable", rec)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("copy did not end: %v", err)
	}
	t.Logf("copy failed as it must: %v", err)
	if bad, lost := r.tgt.badBlockCounts(); bad != 0 || lost != 0 {
		t.Fatalf("target: %d bad, %d lost blocks recorded for data that is only unavailable", bad, lost)
	}
}
