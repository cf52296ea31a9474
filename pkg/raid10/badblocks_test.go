package raid10

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"syscall"
	"testing"
	"time"
)

func TestBadListOps(t *testing.T) {
	var l *badList
	steps := []struct {
		name   string
		add    bool
		start  int64
		count  int64
		want   []badRange
		ranges int
	}{
		{"first", true, 10, 2, []badRange{{10, 2}}, 1},
		{"apart", true, 20, 1, []badRange{{10, 2}, {20, 1}}, 2},
		{"adjacent merges", true, 12, 3, []badRange{{10, 5}, {20, 1}}, 2},
		{"bridge", true, 14, 7, []badRange{{10, 11}}, 1},
		{"before", true, 2, 1, []badRange{{2, 1}, {10, 11}}, 2},
		{"hole", false, 12, 2, []badRange{{2, 1}, {10, 2}, {14, 7}}, 3},
		{"head", false, 0, 3, []badRange{{10, 2}, {14, 7}}, 2},
		{"all", false, 0, 100, nil, 0},
	}
	for _, st := range steps {
		if st.add {
			var ok bool
			l, ok = l.add(st.start, st.count)
			if !ok {
				t.Fatalf("%s: add refused", st.name)
			}
		} else {
			l = l.remove(st.start, st.count)
		}
		if got := l.ranges(); !reflect.DeepEqual(got, st.want) {
			t.Fatalf("%s: %v, want %v", st.name, got, st.want)
		}
		var total int64
		for _, r := range st.want {
			total += r.count
		}
		if l.blocks() != total {
			t.Fatalf("%s: total %d, want %d", st.name, l.blocks(), total)
		}
	}
	l, _ = l.add(10, 5)
	for b, want := range map[int64]bool{9: false, 10: true, 14: true, 15: false} {
		if l.has(b) != want {
			t.Errorf("has(%d) = %v", b, !want)
		}
	}
	if !l.overlaps(0, 11) || l.overlaps(0, 10) || l.overlaps(15, 100) || l.countIn(12, 10) != 3 {
		t.Errorf("overlaps/countIn wrong on %v", l.ranges())
	}
	// A list that would not fit in the superblock is refused.
	var full *badList
	for i := int64(0); i < maxBadRanges; i++ {
		var ok bool
		if full, ok = full.add(2*i, 1); !ok {
			t.Fatalf("refused at %d runs", i)
		}
	}
	if _, ok := full.add(3*maxBadRanges, 1); ok {
		t.Fatalf("run %d accepted", maxBadRanges+1)
	}
}

func TestSuperblockBadBlocksRoundTrip(t *testing.T) {
	sb := &superblock{raidDisks: 2, layout: nearCopies, chunkSize: testChunk, dataOffset: 1 << 20, dataSize: 64 * testChunk,
		arraySize: 64 * testChunk, bitmapOffset: bitmapOffset, bitmapBytes: sbSize, regionSize: testChunk,
		recoveryOff: 3 * testChunk, partial: true, bad: []badRange{{256, 1}, {300, 16}}}
	b := make([]byte, sbSize)
	sb.marshal(b)
	got, err := unmarshalSuperblock(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sb) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, sb)
	}
	// Runs outside the data area, out of order, or a version-1 block
	// carrying them are all rejected or ignored as the format says.
	for name, mut := range map[string]func(*superblock){
		"outside": func(s *superblock) { s.bad = []badRange{{1, 1}} },
		"order":   func(s *superblock) { s.bad = []badRange{{300, 2}, {256, 1}} },
	} {
		s := *sb
		mut(&s)
		s.marshal(b)
		if _, err := unmarshalSuperblock(b); !errors.Is(err, ErrCorruptSuperblock) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// badRig is an array over faulty in-memory members with a model of its
// data, for the bad-block tests.
type badRig struct {
	t     *testing.T
	a     *Array
	bases []*MemMember
	fs    []*FaultyMember
	model []byte
}

func newBadRig(t *testing.T, n int, opts Options) *badRig {
	r := &badRig{t: t}
	ms := make([]Member, n)
	for i := range ms {
		r.bases = append(r.bases, NewMemMember(4<<20))
		r.fs = append(r.fs, NewFaultyMember(r.bases[i]))
		ms[i] = r.fs[i]
	}
	a, err := Create(ms, CreateOptions{Options: opts, ChunkSize: testChunk, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	r.a = a
	r.model = make([]byte, a.Size())
	rng := rand.New(rand.NewPCG(1, 2))
	fillRand(rng, r.model)
	if _, err := a.WriteAt(r.model, 0); err != nil {
		t.Fatal(err)
	}
	return r
}

// newDeadlineRig is newBadRig with n members and the member deadline d.
func newDeadlineRig(t *testing.T, n int, d time.Duration) *badRig {
	opts := testOpts()
	opts.MemberTimeout = d
	return newBadRig(t, n, opts)
}

// withDeviceLatency gives every member 50µs of latency and makes 64 reads and
// writes, so that each member's latency average sees it and its calls go to
// workers (rescue: a stuck call can be abandoned).
func (r *badRig) withDeviceLatency() {
	r.t.Helper()
	a := r.a
	for _, f := range r.fs {
		f.SetLatency(50 * time.Microsecond)
	}
	p := make([]byte, BlockSize)
	for i := range int64(64) { // a write reaches both copies, a read one
		if _, err := a.ReadAt(p, i*BlockSize); err != nil {
			r.t.Fatal(err)
		}
		if _, err := a.WriteAt(r.model[i*BlockSize:(i+1)*BlockSize], i*BlockSize); err != nil {
			r.t.Fatal(err)
		}
	}
	for i, s := range a.slots {
		if !a.rescue(s) {
			r.t.Fatalf("member %d: latency average %d ns: not handed off", i, s.wlat.Load())
		}
	}
}

// verifyBlocks reads every block and returns the blocks that failed with
// EIO; any other error or any data that differs from the model fails.
func (r *badRig) verifyBlocks(a *Array) []int64 {
	r.t.Helper()
	var eio []int64
	p := make([]byte, BlockSize)
	for off := int64(0); off < a.Size(); off += BlockSize {
		_, err := a.ReadAt(p, off)
		switch {
		case errors.Is(err, syscall.EIO):
			eio = append(eio, off/BlockSize)
		case err != nil:
			r.t.Fatalf("read %d: %v", off, err)
		case !bytes.Equal(p, r.model[off:off+BlockSize]):
			r.t.Fatalf("block %d: data that was never written there", off/BlockSize)
		}
	}
	return eio
}

// TestUnreadableSourceDuringRecovery is the reviewer's probe: a block of the
// only copy is unreadable while its partner is rebuilt. The block must be
// recorded bad on both, read back as EIO (never the fresh disk's contents),
// the array must say Degraded, and all of it must survive a restart; a write
// to the block makes it good again.
func TestUnreadableSourceDuringRecovery(t *testing.T) {
	r := newBadRig(t, 2, testOpts())
	a := r.a
	if err := a.FailMember(1); err != nil {
		t.Fatal(err)
	}
	_, _, o0, _ := a.geo.mapChunk(3)
	badBlock := int64(3*testChunk/BlockSize + 2) // array block of chunk 3, block 2
	r.fs[0].FailRange(o0+2*BlockSize, BlockSize, true, false)
	fresh := NewMemMember(4 << 20)
	fill := make([]byte, 4<<20)
	for i := range fill {
		fill[i] = 0xee // what the fresh disk held
	}
	copy(fresh.data, fill)
	if err := a.ReplaceMember(1, fresh); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.fs[0].ClearFaults()
	st := a.Status()
	if st.State != ArrayDegraded || st.Members[0].BadBlocks != 1 || st.Members[1].BadBlocks != 1 || st.BadBlocks != 2 || st.LostBlocks != 1 {
		t.Fatalf("status after the recovery: state %v bad %d lost %d members %+v", st.State, st.BadBlocks, st.LostBlocks, st.Members)
	}
	for i := 0; i < 20; i++ {
		if eio := r.verifyBlocks(a); !reflect.DeepEqual(eio, []int64{badBlock}) {
			t.Fatalf("pass %d: EIO blocks %v, want [%d]", i, eio, badBlock)
		}
	}
	// After a restart the marks are still there: nothing resyncs the
	// fresh disk's contents into view.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := mustAssemble(t, r.bases[0], fresh)
	defer b.Close()
	if st := b.Status(); st.LostBlocks != 1 || st.State != ArrayDegraded {
		t.Fatalf("after assemble: %+v", st)
	}
	if eio := r.verifyBlocks(b); !reflect.DeepEqual(eio, []int64{badBlock}) {
		t.Fatalf("after assemble: EIO blocks %v", eio)
	}
	// A write to every copy makes the block good.
	p := make([]byte, BlockSize)
	fillRand(rand.New(rand.NewPCG(3, 4)), p)
	if _, err := b.WriteAt(p, badBlock*BlockSize); err != nil {
		t.Fatal(err)
	}
	copy(r.model[badBlock*BlockSize:], p)
	if eio := r.verifyBlocks(b); len(eio) != 0 {
		t.Fatalf("after the write: EIO blocks %v", eio)
	}
	if st := b.Status(); st.State != ArrayOptimal || st.BadBlocks != 0 {
		t.Fatalf("after the write: %v, %d bad", st.State, st.BadBlocks)
	}
	res, err := b.Check(t.Context())
	if err != nil || res.Mismatches != 0 || res.Lost != 0 {
		t.Fatalf("check: %+v %v", res, err)
	}
}

// TestUnreadableLastCopy: one member is out and a block of the only copy
// cannot be read. Only that block fails; the array is Degraded, not Failed.
func TestUnreadableLastCopy(t *testing.T) {
	r := newBadRig(t, 4, testOpts())
	a := r.a
	if err := a.FailMember(3); err != nil {
		t.Fatal(err)
	}
	d0, _, o0, _ := a.geo.mapChunk(1) // chunk 1 lives on members 2 and 3
	if d0 != 2 {
		t.Fatalf("chunk 1 on member %d", d0)
	}
	r.fs[2].FailRange(o0+5*BlockSize, 2*BlockSize, true, false)
	eio := r.verifyBlocks(a)
	first := int64(testChunk/BlockSize + 5)
	if !reflect.DeepEqual(eio, []int64{first, first + 1}) {
		t.Fatalf("EIO blocks %v", eio)
	}
	if st := a.Status(); st.State != ArrayDegraded || st.LostBlocks != 2 || st.Members[2].State != MemberInSync {
		t.Fatalf("status %v lost %d members %+v", st.State, st.LostBlocks, st.Members)
	}
	// The marks stop reads from touching the bad sectors again.
	reads := r.fs[2]
	reads.ClearFaults()
	if got := r.verifyBlocks(a); !reflect.DeepEqual(got, eio) {
		t.Fatalf("second pass EIO %v", got)
	}
	_ = reads
}

// TestReadErrorHealsFromOtherCopy: with both copies present, an unreadable
// block is served from the other copy and rewritten: no mark, no EIO.
func TestReadErrorHealsFromOtherCopy(t *testing.T) {
	r := newBadRig(t, 2, testOpts())
	_, _, o0, _ := r.a.geo.mapChunk(2)
	r.fs[0].FailRange(o0, testChunk, true, false)
	if eio := r.verifyBlocks(r.a); len(eio) != 0 {
		t.Fatalf("EIO %v", eio)
	}
	if st := r.a.Status(); st.State != ArrayOptimal || st.BadBlocks != 0 || st.Members[0].ReadErrors == 0 {
		t.Fatalf("status %+v", st)
	}
	r.a.Close()
}

// TestWriteErrorOnLastCopyRecordsBad: with three members, member 0 holds the
// last copy of chunk 2 (its partner is out); a write error on member 0 to
// chunk 0, whose other copy took the write, cannot fail member 0: the range
// is recorded bad there and the write succeeds from the other copy.
func TestWriteErrorOnLastCopyRecordsBad(t *testing.T) {
	r := newBadRig(t, 3, testOpts())
	a := r.a
	// chunk 1 is on members 2 and 0; fail member 2.
	if d0, d1, _, _ := a.geo.mapChunk(1); d0 != 2 || d1 != 0 {
		t.Fatalf("chunk 1 on %d,%d", d0, d1)
	}
	if err := a.FailMember(2); err != nil {
		t.Fatal(err)
	}
	_, _, o0, _ := a.geo.mapChunk(0)
	r.fs[0].FailRange(o0, BlockSize, false, true)
	p := make([]byte, BlockSize)
	fillRand(rand.New(rand.NewPCG(5, 6)), p)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatalf("write: %v", err)
	}
	copy(r.model, p)
	st := a.Status()
	if st.Members[0].State != MemberInSync || st.Members[0].BadBlocks != 1 || st.LostBlocks != 0 || st.State != ArrayDegraded {
		t.Fatalf("status %v lost %d %+v", st.State, st.LostBlocks, st.Members)
	}
	if eio := r.verifyBlocks(a); len(eio) != 0 {
		t.Fatalf("EIO %v", eio)
	}
	a.Close()
}

// TestRecoveryResumes: a recovery interrupted by Close resumes from its
// checkpoint after Assemble, copies less than the whole member, and the
// data is right afterwards.
func TestRecoveryResumes(t *testing.T) {
	old := checkpointEvery
	checkpointEvery = 20 * time.Millisecond
	defer func() { checkpointEvery = old }()
	opts := testOpts()
	opts.SyncRateMax = 8 << 20 // 4 MiB members: about half a second
	r := newBadRig(t, 2, opts)
	a := r.a
	if err := a.FailMember(1); err != nil {
		t.Fatal(err)
	}
	fresh := NewMemMember(4 << 20)
	if err := a.ReplaceMember(1, fresh); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "half the recovery", func() bool {
		st := a.Status()
		return st.Sync.Kind == SyncRecovery && st.Sync.Done > st.Sync.Total/2
	})
	total := a.Status().Sync.Total
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := mustAssemble(t, r.bases[0], fresh)
	defer b.Close()
	if err := b.WaitSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := b.Status()
	if st.State != ArrayOptimal || st.Sync.Kind != SyncRecovery || st.Sync.Total >= total*3/4 || st.Sync.Total == 0 {
		t.Fatalf("resumed recovery: state %v, %+v (first run's total %d)", st.State, st.Sync, total)
	}
	t.Logf("first run: %d bytes to copy; resumed: %d", total, st.Sync.Total)
	if eio := r.verifyBlocks(b); len(eio) != 0 {
		t.Fatalf("EIO %v", eio)
	}
	res, err := b.Check(t.Context())
	if err != nil || res.Mismatches != 0 {
		t.Fatalf("check %+v %v", res, err)
	}
}

// TestMemberTimeout: a member that hangs is failed within the deadline and
// the requests complete from the other copy; it cannot be added back while
// a call to it is still stuck, and can once the call returned.
func TestMemberTimeout(t *testing.T) {
	r := newDeadlineRig(t, 2, 200*time.Millisecond)
	a := r.a
	r.withDeviceLatency()
	r.fs[1].Stall()
	start := time.Now()
	w := make([]byte, 8*BlockSize)
	fillRand(rand.New(rand.NewPCG(7, 8)), w)
	if _, err := a.WriteAt(w, 0); err != nil {
		t.Fatalf("write during the stall: %v", err)
	}
	copy(r.model, w)
	t.Logf("the write took %v with a %v deadline", time.Since(start), a.timeout())
	st := a.Status()
	if st.Members[1].State != MemberFaulty || st.Members[1].TimedOut != 1 {
		t.Fatalf("member 1: %+v", st.Members[1])
	}
	before := a.slots[1].readOps.Load()
	if eio := r.verifyBlocks(a); len(eio) != 0 { // from the good copy
		t.Fatalf("EIO %v", eio)
	}
	if n := a.slots[1].readOps.Load(); n != before {
		t.Fatalf("%d reads went to the failed member", n-before)
	}
	if err := a.ReplaceMember(1, r.fs[1]); !errors.Is(err, ErrBusy) {
		t.Fatalf("re-add with a stuck call: %v", err)
	}
	r.fs[1].Unstall()
	waitFor(t, "the stuck call to end", func() bool { return a.ReplaceMember(1, r.fs[1]) == nil })
	if err := a.WaitSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); st.State != ArrayOptimal {
		t.Fatalf("after re-add: %+v", st)
	}
	if eio := r.verifyBlocks(a); len(eio) != 0 {
		t.Fatalf("EIO %v", eio)
	}
	res, err := a.Check(t.Context())
	if err != nil || res.Mismatches != 0 {
		t.Fatalf("check %+v %v", res, err)
	}
	a.Close()
}

// TestMemberTimeoutSharedStall: when both copies of a chunk stall at once (the
// host's stall, a controller both disks share), neither member is failed:
// failing one would serve its requests no sooner, they wait for the other
// copy, and would leave the array degraded once the stall ends. Before, the
// first member the monitor saw was failed and its partner waited (a guest
// starved by its host lost half of every array's members that way). Both
// stalls are counted; the write completes once the stall ends and the array
// is still optimal. A stall of one pair leaves the other pair's chunks served.
func TestMemberTimeoutSharedStall(t *testing.T) {
	const deadline = 200 * time.Millisecond
	r := newDeadlineRig(t, 4, deadline)
	a := r.a
	defer a.Close()
	r.withDeviceLatency()
	p := make([]byte, BlockSize)
	// Chunk 0 is on members 0 and 1, chunk 1 on members 2 and 3.
	r.fs[0].Stall()
	r.fs[1].Stall()
	w := make([]byte, BlockSize)
	fillRand(rand.New(rand.NewPCG(9, 10)), w)
	done := make(chan error, 1)
	go func() { _, err := a.WriteAt(w, 0); done <- err }()
	time.Sleep(5 * deadline)
	if _, err := a.ReadAt(p, testChunk); err != nil { // the other pair's chunk
		t.Errorf("read of chunk 1 during the stall of members 0 and 1: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the write to the stalled pair returned during the stall: %v", err)
	default:
	}
	// The slots, not Status: a failure being recorded waits for the stalled partner.
	for i := range 2 {
		s := a.slots[i]
		if st, to, sl := MemberState(s.state.Load()), s.timeouts.Load(), s.slowLast.Load(); st != MemberInSync || to != 0 || sl != 1 {
			t.Errorf("member %d during a stall both copies share: %s, %d timed out, %d stalls waited for; want in sync, 0, 1", i, st, to, sl)
		}
	}
	r.fs[0].Unstall()
	r.fs[1].Unstall()
	if t.Failed() {
		t.FailNow()
	}
	if err := <-done; err != nil {
		t.Fatalf("write after the stall: %v", err)
	}
	copy(r.model, w)
	if st := a.Status(); st.State != ArrayOptimal {
		t.Fatalf("array after the shared stall: %s %+v", st.State, st.Members)
	}
	if eio := r.verifyBlocks(a); len(eio) != 0 {
		t.Fatalf("EIO %v", eio)
	}
	// A stall of one member alone still fails it (TestMemberTimeout), also after a shared
	// one: its partner answers.
	r.fs[1].Stall()
	if _, err := a.WriteAt(w, 0); err != nil {
		t.Fatalf("write during the stall of member 1 alone: %v", err)
	}
	if m := a.Status().Members[1]; m.State != MemberFaulty || m.TimedOut != 1 {
		t.Fatalf("member 1 stalled alone: %+v", m)
	}
	r.fs[1].Unstall()
}

// TestStatusWhileMetadataHeld: Status answers while metaMu is held, as it is
// while a member failure is recorded in superblocks that a stalled member
// does not take (the agent's status and the metrics would otherwise wait as
// long as the stall).
func TestStatusWhileMetadataHeld(t *testing.T) {
	r := newBadRig(t, 2, testOpts())
	a := r.a
	defer a.Close()
	want := a.Status().Events
	a.metaMu.Lock()
	done := make(chan Status, 1)
	go func() { done <- a.Status() }()
	select {
	case st := <-done:
		a.metaMu.Unlock()
		if st.Events != want || st.State != ArrayOptimal {
			t.Fatalf("status with metaMu held: events %d, state %s; want %d, optimal", st.Events, st.State, want)
		}
	case <-time.After(10 * time.Second):
		a.metaMu.Unlock()
		<-done
		t.Fatal("Status waited for metaMu")
	}
}

// TestNoCallReachesFailedMember: a member call made after its member was
// failed fails at once and leaves the member's storage untouched, inline and
// handed off. A write that loaded the member before it was failed but ran
// after could otherwise land beside an abandoned call still inside the
// member; no one waits for it, so nothing orders it before the member's
// re-add.
func TestNoCallReachesFailedMember(t *testing.T) {
	r := newDeadlineRig(t, 2, 10*time.Second)
	a := r.a
	defer a.Close()
	s := a.slots[1]
	ref := s.ref.Load()
	if err := a.FailMember(1); err != nil {
		t.Fatal(err)
	}
	if !ref.gone.Load() {
		t.Fatal("the failed member's ref is not marked gone")
	}
	_, _, _, o1 := a.geo.mapChunk(0)
	want := slices.Clone(r.bases[1].data[o1 : o1+2*BlockSize])
	p := bytes.Repeat([]byte{0x5a}, BlockSize)
	if err := a.memberWrite(s, ref, opWrite, p, o1, BlockSize, false); !errors.Is(err, errMemberGone) {
		t.Errorf("inline write to the failed member: %v, want %v", err, errMemberGone)
	}
	err, ok := a.handedOff(s, ref, opWrite, p, o1+BlockSize, BlockSize, false)
	if !ok || !errors.Is(err, errMemberGone) {
		t.Errorf("handed-off write to the failed member: %v (handed off %v), want %v", err, ok, errMemberGone)
	}
	if err := a.memberRead(s, ref, p, o1); !errors.Is(err, errMemberGone) {
		t.Errorf("read from the failed member: %v, want %v", err, errMemberGone)
	}
	if err := a.memberFlush(ref); !errors.Is(err, errMemberGone) {
		t.Errorf("flush of the failed member: %v, want %v", err, errMemberGone)
	}
	if !bytes.Equal(r.bases[1].data[o1:o1+2*BlockSize], want) {
		t.Fatal("a write made after the failure reached the failed member's storage")
	}
	if n := a.zombieCount(ref.m); n != 0 {
		t.Fatalf("%d zombie calls counted for calls that never ran", n)
	}
	if err := a.ReplaceMember(1, r.fs[1]); err != nil {
		t.Fatalf("re-add: %v", err)
	}
	if err := a.WaitSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if eio := r.verifyBlocks(a); len(eio) != 0 {
		t.Fatalf("EIO %v", eio)
	}
}

// TestCheckRangeResumes: a check cancelled midway reports where it got to;
// CheckRange from there covers the rest, finds a mismatch planted beyond
// that point and skips one planted before it.
func TestCheckRangeResumes(t *testing.T) {
	opts := testOpts()
	opts.SyncRateMax = 4 << 20 // 3 MiB: under a second
	opts.SyncRateMin = 4 << 20
	r := newBadRig(t, 2, opts)
	a := r.a
	defer a.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan ScrubResult, 1)
	go func() {
		res, _ := a.Check(ctx)
		done <- res
	}()
	waitFor(t, "a third of the check", func() bool {
		st := a.Status().Sync
		return st.Kind == SyncCheck && st.Done > a.Size()/3
	})
	cancel()
	<-done
	resume := a.Status().Sync.Done
	if resume <= 0 || resume >= a.Size() {
		t.Fatalf("resume point %d of %d", resume, a.Size())
	}
	// One mismatch before the resume point, one after.
	before, after := int64(0), resume+testChunk
	for _, off := range []int64{before, after} {
		c := off / testChunk
		_, _, _, o1 := a.geo.mapChunk(c)
		r.bases[1].data[o1+100] ^= 0xff
	}
	res, err := a.CheckRange(t.Context(), resume)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mismatches != 1 || res.Checked != a.Size()-resume/testChunk*testChunk {
		t.Fatalf("resumed check: %+v (from %d of %d)", res, resume, a.Size())
	}
	if st := a.Status().Sync; st.Done != a.Size() || st.Total != a.Size() {
		t.Fatalf("progress after the resumed check: %+v", st)
	}
	if _, err := a.CheckRange(t.Context(), -1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative offset: %v", err)
	}
}

// TestCloseDuringScrub: Close while a caller's scrub hands member calls to the
// workers (device latency) waits for the scrub to stop before it ends the
// workers; the scrub returns ErrClosed. Closing the work queue under such a
// scrub would panic (a send on a closed channel).
func TestCloseDuringScrub(t *testing.T) {
	r := newBadRig(t, 2, testOpts())
	a := r.a
	r.withDeviceLatency()
	for _, f := range r.fs {
		f.SetLatency(20 * time.Millisecond) // each scrub chunk takes two slow calls: Close lands between them
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.CheckRange(context.Background(), 0)
		done <- err
	}()
	waitFor(t, "the scrub to start", func() bool { return a.Status().Sync.Kind == SyncCheck })
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("scrub cut by Close: %v, want ErrClosed", err)
	}
}
