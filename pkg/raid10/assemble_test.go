package raid10

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// newMemArray creates an array over n in-memory members, closes it cleanly
// and returns the members for Assemble.
// mustAssemble assembles ms with testOpts, failing the test if it cannot.
func mustAssemble(t *testing.T, ms ...Member) *Array {
	t.Helper()
	a, err := Assemble(ms, AssembleOptions{Options: testOpts()})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func newMemArray(t *testing.T, n int, opts CreateOptions) []*MemMember {
	t.Helper()
	ms := make([]Member, n)
	mm := make([]*MemMember, n)
	for i := range ms {
		mm[i] = NewMemMember(4 << 20)
		ms[i] = mm[i]
	}
	opts.Options = testOpts()
	opts.AssumeClean = true
	if opts.ChunkSize == 0 {
		opts.ChunkSize = testChunk
	}
	a, err := Create(ms, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	return mm
}

func members(mm ...*MemMember) []Member {
	ms := make([]Member, len(mm))
	for i, m := range mm {
		if m != nil {
			ms[i] = m
		}
	}
	return ms
}

func corrupt(m *MemMember, off int64) { m.data[off+100] ^= 0xff }

func TestAssembleErrors(t *testing.T) {
	uuid := [16]byte{1, 2, 3}
	cases := []struct {
		name    string
		members func(t *testing.T) []Member
		opts    AssembleOptions
		want    error // nil: assembles
		state   ArrayState
		member  int // for superblock errors: the position reported
	}{
		{
			name:    "all members",
			members: func(t *testing.T) []Member { return members(newMemArray(t, 4, CreateOptions{})...) },
			state:   ArrayOptimal,
		},
		{
			name: "one member missing",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 4, CreateOptions{})
				return members(m[0], nil, m[2], m[3])
			},
			state: ArrayDegraded,
		},
		{
			name: "odd count, every other member missing is too few",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 3, CreateOptions{})
				return members(m[0])
			},
			want: ErrTooFewMembers,
		},
		{
			name: "both copies of a pair missing",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 4, CreateOptions{})
				return members(m[2], m[3])
			},
			want: ErrTooFewMembers,
		},
		{
			name:    "no members",
			members: func(t *testing.T) []Member { return nil },
			want:    ErrTooFewMembers,
		},
		{
			name: "members of different arrays",
			members: func(t *testing.T) []Member {
				a := newMemArray(t, 2, CreateOptions{})
				b := newMemArray(t, 2, CreateOptions{})
				return members(a[0], b[1])
			},
			want: ErrMixedArrays,
		},
		{
			name: "not the expected array",
			members: func(t *testing.T) []Member {
				return members(newMemArray(t, 2, CreateOptions{})...)
			},
			opts: AssembleOptions{UUID: uuid},
			want: ErrMixedArrays,
		},
		{
			name: "same UUID, different geometry",
			members: func(t *testing.T) []Member {
				a := newMemArray(t, 2, CreateOptions{UUID: uuid})
				b := newMemArray(t, 2, CreateOptions{UUID: uuid, ChunkSize: 2 * testChunk})
				return members(a[0], b[1])
			},
			want: ErrGeometryMismatch,
		},
		{
			name: "both superblock copies corrupt",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 2, CreateOptions{})
				corrupt(m[1], sbCopyA)
				corrupt(m[1], sbCopyB)
				return members(m...)
			},
			want:   ErrCorruptSuperblock,
			member: 1,
		},
		{
			name: "one superblock copy corrupt (torn write) is fine",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 2, CreateOptions{})
				corrupt(m[0], sbCopyA)
				corrupt(m[1], sbCopyB)
				return members(m...)
			},
			state: ArrayOptimal,
		},
		{
			name: "blank member",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 2, CreateOptions{})
				return members(m[0], NewMemMember(4<<20))
			},
			want:   ErrNoSuperblock,
			member: 1,
		},
		{
			name: "same member twice",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 2, CreateOptions{})
				return members(m[0], m[0], m[1])
			},
			want: ErrDuplicateRole,
		},
		{
			name: "member shrunk",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 2, CreateOptions{})
				short, err := NewExtentMember(m[1], 0, 2<<20)
				if err != nil {
					t.Fatal(err)
				}
				return []Member{m[0], short}
			},
			want: ErrMemberTooSmall,
		},
		{
			name: "corrupt bitmap block is tolerated",
			members: func(t *testing.T) []Member {
				m := newMemArray(t, 2, CreateOptions{})
				corrupt(m[0], bitmapOffset)
				return members(m...)
			},
			state: ArrayOptimal,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Options = testOpts()
			a, err := Assemble(tc.members(t), tc.opts)
			if tc.want != nil {
				if !errors.Is(err, tc.want) {
					t.Fatalf("got %v, want %v", err, tc.want)
				}
				var me *MemberError
				if errors.As(err, &me) && me.Member != tc.member {
					t.Fatalf("error names member %d, want %d", me.Member, tc.member)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if st := a.State(); st != tc.state {
				t.Fatalf("state %v, want %v", st, tc.state)
			}
		})
	}
}

func TestCreateErrors(t *testing.T) {
	cases := []struct {
		name    string
		members []Member
		opts    CreateOptions
		want    error
	}{
		{"one member", []Member{NewMemMember(4 << 20)}, CreateOptions{}, ErrTooFewMembers},
		{"tiny members", []Member{NewMemMember(64 << 10), NewMemMember(64 << 10)}, CreateOptions{}, ErrMemberTooSmall},
		{"chunk not a power of two", []Member{NewMemMember(4 << 20), NewMemMember(4 << 20)}, CreateOptions{ChunkSize: 12288}, ErrInvalid},
		{"region not a chunk multiple", []Member{NewMemMember(4 << 20), NewMemMember(4 << 20)}, CreateOptions{ChunkSize: 8192, RegionSize: 12288}, ErrInvalid},
		{"size too large", []Member{NewMemMember(4 << 20), NewMemMember(4 << 20)}, CreateOptions{ChunkSize: 8192, Size: 8 << 20}, ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Create(tc.members, tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestUncleanResyncUsesBitmap checks that after an unclean stop only the
// regions written are resynced, and that differing copies end up equal.
func TestUncleanResyncUsesBitmap(t *testing.T) {
	mm := newMemArray(t, 4, CreateOptions{RegionSize: testChunk})
	a, err := Assemble(members(mm...), AssembleOptions{Options: Options{SyncRateMax: -1, BitmapClearDelay: 1 << 40}})
	if err != nil {
		t.Fatal(err)
	}
	p := AlignedBuffer(BlockSize)
	p[0] = 7
	if _, err := a.WriteAt(p, 5*testChunk); err != nil {
		t.Fatal(err)
	}
	// Make the copies differ behind the array's back, then "crash": no
	// Close, so the superblocks stay dirty.
	d0, d1, o0, o1 := a.geo.mapChunk(5)
	mm[d1].data[o1] = 9
	_ = d0
	_ = o0
	a.closed.Store(true)
	close(a.stop)
	a.bg.Wait()
	b, err := Assemble(members(mm...), AssembleOptions{Options: testOpts()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.WaitSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := b.Status(); st.Sync.Kind != SyncResync || st.Sync.Total != testChunk || st.Sync.Done != testChunk {
		t.Fatalf("want a resync of one region: %+v", st.Sync)
	}
	res, err := b.Check(t.Context())
	if err != nil || res.Mismatches != 0 {
		t.Fatalf("check: %+v %v", res, err)
	}
}

// hangAfterFirstRead is a member that answers its first read (the
// superblock) and then hangs every call until Unstall.
type hangAfterFirstRead struct {
	*FaultyMember
	reads atomic.Int32
}

func (h *hangAfterFirstRead) ReadAt(p []byte, off int64) (int, error) {
	n, err := h.FaultyMember.ReadAt(p, off)
	if h.reads.Add(1) == 1 {
		h.Stall()
	}
	return n, err
}

// countReads counts the reads that returned.
type countReads struct {
	Member
	done atomic.Int32
}

func (c *countReads) ReadAt(p []byte, off int64) (int, error) {
	defer c.done.Add(1)
	return c.Member.ReadAt(p, off)
}

// TestAssembleHungMember: Assemble bounds member I/O by the member deadline.
// Without it, each case hangs until the member answers (the watchdog
// fails it with the stacks).
func TestAssembleHungMember(t *testing.T) {
	opts := testOpts()
	// 1 s, not less: under -race on a loaded 2-core machine a healthy
	// member's call can take over 100 ms.
	opts.MemberTimeout = time.Second
	// setup is a clean 4-member array (slots 0,1 and 2,3 mirrored) holding
	// data, with slot 2 failed first if fail2.
	setup := func(t *testing.T, fail2 bool) ([]*FaultyMember, []byte) {
		var fs []*FaultyMember
		var ms []Member
		for range 4 {
			f := NewFaultyMember(NewMemMember(4 << 20))
			fs = append(fs, f)
			ms = append(ms, f)
		}
		// The default deadline here: a short one may pass on a loaded machine.
		a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, AssumeClean: true})
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, a.Size())
		fillRand(rand.New(rand.NewPCG(5, 6)), data)
		if _, err := a.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		if fail2 {
			if err := a.FailMember(2); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		return fs, data
	}
	check := func(t *testing.T, a *Array, data []byte) {
		p := make([]byte, len(data))
		if _, err := a.ReadAt(p, 0); err != nil || !bytes.Equal(p, data) {
			t.Fatalf("read after assembly: %v, data equal %v", err, bytes.Equal(p, data))
		}
	}
	assemble := func(t *testing.T, ms []Member, unstall func()) (*Array, error) {
		var a *Array
		var err error
		watchdog(t, "Assemble with a hung member", func() {
			a, err = Assemble(ms, AssembleOptions{Options: opts})
		}, unstall)
		return a, err
	}

	t.Run("live member hangs on its superblock: refused, not hung", func(t *testing.T) {
		fs, _ := setup(t, false)
		fs[2].Stall()
		defer fs[2].Unstall()
		h := &countReads{Member: fs[2]}
		_, err := assemble(t, []Member{fs[0], fs[1], h, fs[3]}, fs[2].Unstall)
		var me *MemberError
		if !errors.As(err, &me) || me.Member != 2 || !errors.Is(err, syscall.EIO) {
			t.Fatalf("Assemble: %v, want a MemberError for member 2 matching EIO", err)
		}
		t.Logf("refused: %v", err)
		// The members are untouched: once it answers, all assemble.
		fs[2].Unstall()
		waitFor(t, "the abandoned superblock read to end", func() bool { return h.done.Load() > 0 })
		a, err := Assemble([]Member{fs[0], fs[1], fs[2], fs[3]}, AssembleOptions{Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if st := a.State(); st != ArrayOptimal {
			t.Fatalf("state %v after the member answered", st)
		}
	})
	t.Run("failed member hangs on its superblock: left out", func(t *testing.T) {
		fs, data := setup(t, true)
		fs[2].Stall()
		defer fs[2].Unstall()
		a, err := assemble(t, []Member{fs[0], fs[1], fs[2], fs[3]}, fs[2].Unstall)
		if err != nil {
			t.Fatalf("Assemble: %v", err)
		}
		defer a.Close()
		if st := a.Status(); st.State != ArrayDegraded || st.Members[2].State != MemberMissing {
			t.Fatalf("state %v, slot 2 %v; want degraded with slot 2 missing", st.State, st.Members[2].State)
		}
		check(t, a, data)
	})
	t.Run("member hangs after its superblock: failed at the deadline", func(t *testing.T) {
		fs, data := setup(t, false)
		h := &hangAfterFirstRead{FaultyMember: fs[1]}
		defer h.Unstall()
		a, err := assemble(t, []Member{fs[0], h, fs[2], fs[3]}, h.Unstall)
		if err != nil {
			t.Fatalf("Assemble: %v", err)
		}
		defer a.Close()
		waitFor(t, "slot 1 failed", func() bool { return a.Status().Members[1].State == MemberFaulty })
		if st := a.State(); st != ArrayDegraded {
			t.Fatalf("state %v, want degraded", st)
		}
		check(t, a, data)
		h.Unstall()
	})
	t.Run("both copies hang after their superblocks: refused, not hung", func(t *testing.T) {
		fs, data := setup(t, false)
		h0, h1 := &hangAfterFirstRead{FaultyMember: fs[0]}, &hangAfterFirstRead{FaultyMember: fs[1]}
		unstall := func() { h0.Unstall(); h1.Unstall() }
		defer unstall()
		i0, i1 := &inflight{Member: h0}, &inflight{Member: h1}
		_, err := assemble(t, []Member{i0, i1, fs[2], fs[3]}, unstall)
		if !errors.Is(err, ErrTooFewMembers) {
			t.Fatalf("Assemble: %v, want ErrTooFewMembers", err)
		}
		t.Logf("refused: %v", err)
		unstall()
		waitFor(t, "the abandoned calls to end", func() bool { return i0.n.Load() == 0 && i1.n.Load() == 0 })
		a, err := Assemble([]Member{fs[0], fs[1], fs[2], fs[3]}, AssembleOptions{Options: testOpts()})
		if err != nil {
			t.Fatalf("Assemble once the members answer: %v", err)
		}
		defer a.Close()
		check(t, a, data)
	})
}

// inflight counts the calls inside a member, so a test can wait for the
// calls an abandoned array left in a hung member before reusing it.
type inflight struct {
	Member
	n atomic.Int32
}

func (c *inflight) ReadAt(p []byte, off int64) (int, error) {
	c.n.Add(1)
	defer c.n.Add(-1)
	return c.Member.ReadAt(p, off)
}

func (c *inflight) WriteAt(p []byte, off int64) (int, error) {
	c.n.Add(1)
	defer c.n.Add(-1)
	return c.Member.WriteAt(p, off)
}

func (c *inflight) Flush() error {
	c.n.Add(1)
	defer c.n.Add(-1)
	return c.Member.Flush()
}

// TestCreateHungMember: Create bounds its metadata I/O by the member
// deadline, fails naming the member that hung (EIO), and leaves no
// superblock that an assembly would trust. Without the deadline monitor
// running during Create each case hangs until the member answers (the
// watchdog fails it with the stacks).
func TestCreateHungMember(t *testing.T) {
	opts := testOpts()
	// 1 s, not less: under -race on a loaded 2-core machine a healthy
	// member's call can take over 100 ms.
	opts.MemberTimeout = time.Second
	for _, tc := range []struct {
		name string
		n    int
		hang []int
	}{
		{"one of four hangs", 4, []int{2}},
		{"both members of a pair hang", 2, []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fs []*FaultyMember
			var ms []Member
			var ins []*inflight
			for _, m := range fileMembers(t, tc.n, 4<<20) {
				f := NewFaultyMember(m)
				in := &inflight{Member: f}
				fs, ms, ins = append(fs, f), append(ms, in), append(ins, in)
			}
			unstall := func() {
				for _, f := range fs {
					f.Unstall()
				}
			}
			defer unstall()
			for _, k := range tc.hang {
				fs[k].Stall()
			}
			var err error
			watchdog(t, "Create with a hung member", func() {
				var a *Array
				a, err = Create(ms, CreateOptions{Options: opts, ChunkSize: testChunk})
				if a != nil {
					_ = a.Close()
				}
			}, unstall)
			var me *MemberError
			if !errors.As(err, &me) || me.Member != tc.hang[0] || !errors.Is(err, syscall.EIO) {
				t.Fatalf("Create: %v, want a MemberError for member %d matching EIO", err, tc.hang[0])
			}
			t.Logf("refused: %v", err)
			unstall()
			for i, in := range ins {
				waitFor(t, "the abandoned calls to end", func() bool { return in.n.Load() == 0 })
				hung := false
				for _, k := range tc.hang {
					hung = hung || k == i
				}
				if _, err := readSuperblock(in); !hung && !errors.Is(err, ErrNoSuperblock) {
					t.Errorf("member %d answered: its superblock reads %v after the failed create, want it wiped", i, err)
				}
			}
			if a, err := Assemble(ms, AssembleOptions{Options: testOpts()}); err == nil {
				_ = a.Close()
				t.Fatalf("Assemble trusted the members of a failed create")
			}
			// The members are reusable once they answer.
			a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk})
			if err != nil {
				t.Fatalf("Create after the members answered: %v", err)
			}
			if st := a.State(); st != ArrayOptimal {
				t.Errorf("state %v after re-create", st)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
