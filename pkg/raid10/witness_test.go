package raid10

import (
	"bytes"
	"errors"
	"testing"
)

// TestAssembleWitness: a witness (AssembleOptions.Witnesses) fresher than every member
// decides which members are in sync, so a member that was away while the witness took
// writes is not trusted alone; a witness that is older, unreadable or of another array
// changes nothing.
func TestAssembleWitness(t *testing.T) {
	// setup: a 2-member array written on member 0 alone while member 1 was away.
	setup := func(t *testing.T) ([]*MemMember, []byte, []byte) {
		mm := newMemArray(t, 2, CreateOptions{})
		a := mustAssemble(t, mm[0], mm[1])
		old := bytes.Repeat([]byte{1}, 64<<10)
		if _, err := a.WriteAt(old, 0); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		a = mustAssemble(t, members(mm[0], nil)...)
		cur := bytes.Repeat([]byte{2}, 64<<10)
		if _, err := a.WriteAt(cur, 0); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		return mm, old, cur
	}
	read := func(t *testing.T, a *Array, n int) []byte {
		t.Helper()
		p := make([]byte, n)
		if _, err := a.ReadAt(p, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// reads: ms assembled with opts reads want.
	reads := func(t *testing.T, ms []Member, opts AssembleOptions, want []byte) {
		t.Helper()
		opts.Options = testOpts()
		a, err := Assemble(ms, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if got := read(t, a, len(want)); !bytes.Equal(got, want) {
			t.Fatal("reads other data than expected")
		}
	}

	t.Run("fresher witness: the stale member alone is refused, then and later", func(t *testing.T) {
		mm, _, cur := setup(t)
		_, err := Assemble(members(nil, mm[1]), AssembleOptions{Options: testOpts(), Witnesses: []Member{mm[0]}})
		if !errors.Is(err, ErrTooFewMembers) || !errors.Is(err, ErrWitnessNeeded) {
			t.Fatalf("Assemble of the stale member with a fresher witness: %v, want ErrTooFewMembers and ErrWitnessNeeded", err)
		}
		// Recorded in its superblock: refused without the witness too (its disk may
		// have left for good).
		if _, err := Assemble(members(nil, mm[1]), AssembleOptions{Options: testOpts()}); !errors.Is(err, ErrTooFewMembers) {
			t.Fatalf("Assemble of the stale member alone after the witness saw it: %v, want ErrTooFewMembers", err)
		}
		// The witness's member back: it is in sync and rebuilds the other.
		a := mustAssemble(t, mm[0], mm[1])
		defer a.Close()
		if got := read(t, a, len(cur)); !bytes.Equal(got, cur) {
			t.Fatal("reads other than the current data")
		}
		waitFor(t, "the stale member rebuilt", func() bool { return a.State() == ArrayOptimal })
	})
	t.Run("fresher witness, stale member and the witness's disk back: recovered", func(t *testing.T) {
		mm, _, cur := setup(t)
		reads(t, members(mm[0], mm[1]), AssembleOptions{Witnesses: []Member{mm[0]}}, cur)
	})
	t.Run("without a witness the stale member is trusted (the hazard)", func(t *testing.T) {
		mm, old, _ := setup(t)
		a := mustAssemble(t, members(nil, mm[1])...)
		defer a.Close()
		if got := read(t, a, len(old)); !bytes.Equal(got, old) {
			t.Fatal("the stale member alone should read its old data")
		}
	})
	t.Run("unreadable witness: ignored", func(t *testing.T) {
		mm, old, _ := setup(t)
		f := NewFaultyMember(mm[0])
		f.Disappear()
		reads(t, members(nil, mm[1]), AssembleOptions{Witnesses: []Member{f}}, old)
	})
	t.Run("witness of another array: ignored", func(t *testing.T) {
		mm, old, _ := setup(t)
		other := newMemArray(t, 2, CreateOptions{})
		reads(t, members(nil, mm[1]), AssembleOptions{Witnesses: []Member{other[0]}}, old)
	})
	t.Run("older witness: the fresh member serves", func(t *testing.T) {
		mm, _, cur := setup(t)
		reads(t, members(mm[0], nil), AssembleOptions{Witnesses: []Member{mm[1]}}, cur)
	})
	t.Run("doubtful member alone: refused", func(t *testing.T) {
		mm, _, _ := setup(t)
		_, err := Assemble(members(nil, mm[1]), AssembleOptions{Options: testOpts(), Doubtful: []bool{false, true}})
		if !errors.Is(err, ErrTooFewMembers) {
			t.Fatalf("Assemble of a doubtful member alone: %v, want ErrTooFewMembers", err)
		}
	})
	t.Run("doubtful member with its partner: the freshest view decides", func(t *testing.T) {
		mm, _, cur := setup(t)
		reads(t, members(mm[0], mm[1]), AssembleOptions{Doubtful: []bool{false, true}}, cur)
	})
	t.Run("doubtful member vouched for by a witness that saw its events: trusted", func(t *testing.T) {
		mm, _, cur := setup(t)
		// Member 0 is current; doubtful, alone, but the witness (a copy of its
		// superblock's view: member 0 itself) saw its events.
		reads(t, members(mm[0], nil), AssembleOptions{Doubtful: []bool{true, false}, Witnesses: []Member{mm[0]}}, cur)
	})
}
