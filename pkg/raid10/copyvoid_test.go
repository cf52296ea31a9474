package raid10

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestCopyFailUnrecorded: a live copy whose target goes away fails without its record
// saying so (the record write fails too), and the source then takes writes into regions
// the copy never copied. Its source's copy generation moves on before those writes, in
// its superblocks: when the target's disks come back and both arrays are assembled again,
// the record (still running) is refused with ErrCopyStale instead of resuming against the
// rewritten source. A second live copy from the same source, running all along, takes
// the new generation into its record: it resumes and ends holding the source as of its
// cut.
func TestCopyFailUnrecorded(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 4))
	r := newCopyRig(t, rng, false)
	prefill(t, r.src, rng)
	size := r.src.Size()
	cut := make([]byte, size)
	if _, err := r.src.ReadAt(cut, 0); err != nil {
		t.Fatal(err)
	}
	tgt2Base, tgt2 := newMemCopyTarget(t, size)
	lost, err := NewCopy(CopyConfig{Source: r.src, Target: r.tgt, Size: size, Live: true})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := NewCopy(CopyConfig{Source: r.src, Target: tgt2, Size: size, Live: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.tgtF {
		f.Disappear()
	}
	// Neither copier runs: the writes' copy-before-write meets the absent target.
	p := make([]byte, size/2)
	fillRand(rng, p)
	if _, err := r.src.WriteAt(p, 0); err != nil {
		t.Fatalf("source write once its copy's target is gone: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := lost.Wait(ctx); !errors.Is(err, ErrCopyFailed) {
		t.Fatalf("copy into a target that went: %v, want ErrCopyFailed", err)
	}
	fillRand(rng, p)
	if _, err := r.src.WriteAt(p, size/2); err != nil {
		t.Fatal(err)
	}
	r.src.metaMu.Lock()
	gen, running := r.src.copyGen, r.src.liveCopies
	r.src.metaMu.Unlock()
	t.Logf("source after the unrecorded failure: copy generation %d, running copies %d", gen, running)
	kept.Stop()
	_ = r.src.Close()
	_ = r.tgt.Close()
	_ = tgt2.Close()

	// The target's disks are back (the members under the faults hold what reached them).
	src := assembleMem(t, r.srcBase)
	defer src.Close()
	tgt := assembleMem(t, r.tgtBase)
	defer tgt.Close()
	tgt2 = assembleMem(t, tgt2Base)
	defer tgt2.Close()
	for _, a := range []*Array{tgt, tgt2} {
		if err := a.Reserve(CopyRecordSize); err != nil {
			t.Fatal(err)
		}
	}
	if rec, err := ReadCopyRecord(tgt); err != nil || rec.State != CopyRunning {
		t.Fatalf("test set-up: the failed copy's record: %+v, %v: want it still running", rec, err)
	}
	if _, err := ResumeCopy(CopyConfig{Source: src, Target: tgt}); !errors.Is(err, ErrCopyStale) {
		t.Fatalf("resume of a copy that failed unrecorded, its source rewritten since: %v, want ErrCopyStale", err)
	}
	c2, err := ResumeCopy(CopyConfig{Source: src, Target: tgt2})
	if err != nil {
		t.Fatalf("resume of the copy that kept running: %v", err)
	}
	if err := src.CopiesResumed(); err != nil || src.liveCopies != 1 {
		t.Fatalf("after the resume: running %d, %v", src.liveCopies, err)
	}
	c2.Start()
	if err := c2.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := tgt2.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, cut) {
		t.Fatal("the copy that kept running does not hold the source as of its cut")
	}
}

// newMemCopyTarget makes a two-member copy target over in-memory members, size bytes
// plus the record.
func newMemCopyTarget(t *testing.T, size int64) ([]*MemMember, *Array) {
	t.Helper()
	bs := []*MemMember{NewMemMember(size + CopyRecordSize + 2<<20), NewMemMember(size + CopyRecordSize + 2<<20)}
	a, err := Create([]Member{bs[0], bs[1]}, CreateOptions{Options: testOpts(), Size: size + CopyRecordSize, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve(CopyRecordSize); err != nil {
		t.Fatal(err)
	}
	return bs, a
}

// assembleMem assembles an array from in-memory members.
func assembleMem(t *testing.T, bs []*MemMember) *Array {
	t.Helper()
	ms := make([]Member, len(bs))
	for i := range bs {
		ms[i] = bs[i]
	}
	a, err := Assemble(ms, AssembleOptions{Options: testOpts()})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
