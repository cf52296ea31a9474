package diskfault

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

const (
	badChunk = 64 << 10 // small chunks: the error ranges cover a few of them
	badSize  = 32 << 20 // the array's size
)

// TestBadBlocksInGuest puts `error` segments into members of a RAID10 of 4 dm devices
// served on /dev/nbdX (no file system: the blocks are addressed directly).
//
// One copy unreadable: member 2 answers member rows 8-11 (4 chunks) with errors; fio
// reads back and verifies everything it wrote before (0 errors: those chunks come from
// member 3), and a scrub reads every copy. A fix-up write into the error range fails
// member 2 (a write error fails a member that does not hold a last copy, as md
// without a bad-block log); it is switched back to linear and re-added.
//
// Both copies unreadable: members 2 and 3 both answer rows 10-11 with errors. Reading
// the whole device, exactly the blocks of the two array chunks stored there fail with
// EIO; every other block reads back as before. Both members stay in sync with those
// blocks recorded bad (Status.LostBlocks). Switched back to linear, a write over the
// lost chunks clears the marks and a scrub finds the copies equal.
func TestBadBlocksInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestDiskFaultVM")
	vm.RequireTools(t, "dmsetup", "fio")
	devs := newDM(t, "r10bad", 4, 4)
	members, files := openMembers(t, devs)
	arr, err := raid10.Create(members, raid10.CreateOptions{AssumeClean: true, ChunkSize: badChunk, Size: badSize,
		Options: raid10.Options{MemberTimeout: slowDeadline}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { arr.Close() })
	dev := serve(t, arr, "vol-bad")
	off := dataOffset(t, devs[2].Path())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	fioArgs := []string{"--name=bad", "--filename=" + dev, fmt.Sprintf("--size=%d", badSize), "--bs=64k",
		"--rw=write", "--ioengine=libaio", "--iodepth=8", "--direct=1", "--verify=crc32c",
		"--verify_state_save=0", "--verify_fatal=1"}
	vm.Sh(t, "fio", append(fioArgs, "--do_verify=0")...)

	// One copy unreadable.
	devs[2].Swap(t, devs[2].WithErrors(off+8*badChunk, 4*badChunk))
	out := vm.Sh(t, "fio", append(fioArgs, "--verify_only")...)
	if !bytes.Contains([]byte(out), []byte("err= 0")) {
		t.Fatalf("fio verify over one unreadable copy reported errors:\n%s", out)
	}
	sr, err := arr.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := arr.Status()
	figure(t, "one copy unreadable", "fio verify 0 errors; scrub %+v; member 2 %s, %d read errors, %d write errors, %d blocks bad; array %s",
		sr, st.Members[2].State, st.Members[2].ReadErrors, st.Members[2].WriteErrors, st.Members[2].BadBlocks, st.State)
	if sr.Lost != 0 || st.LostBlocks != 0 {
		t.Fatalf("blocks lost with one copy readable: scrub %+v, status lost %d", sr, st.LostBlocks)
	}
	if st.Members[2].ReadErrors == 0 {
		t.Errorf("member 2's error range was never read")
	}
	devs[2].Swap(t, devs[2].Linear())
	if st.Members[2].State != raid10.MemberInSync {
		if _, err := arr.AddMember(files[2]); err != nil {
			t.Fatalf("re-add member 2: %v", err)
		}
	}
	if err := arr.WaitSync(ctx); err != nil {
		t.Fatal(err)
	}
	if st := arr.Status(); st.State != raid10.ArrayOptimal {
		t.Fatalf("array %s after re-adding member 2: %+v", st.State, st.Members)
	}
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	snap := aligned(badSize)
	if _, err := f.ReadAt(snap, 0); err != nil {
		t.Fatal(err)
	}

	// Both copies unreadable: rows 10 and 11 of the pair (2, 3) hold array chunks 21 and
	// 23 (near-2 over 4 members: chunk c is on members 2(c mod 2) and 2(c mod 2)+1, row
	// c/2).
	for _, d := range devs[2:] {
		d.Swap(t, d.WithErrors(off+10*badChunk, 2*badChunk))
	}
	lostFrom, lostTo := int64(21*badChunk), int64(24*badChunk) // chunks 21 and 23, not 22
	lost := func(o int64) bool {
		return o >= lostFrom && o < lostTo && (o/badChunk)%2 == 1
	}
	var eio, wrong int
	buf, blk := aligned(badChunk), aligned(raid10.BlockSize)
	for o := int64(0); o < badSize; o += badChunk {
		if _, err := f.ReadAt(buf, o); err == nil {
			if !bytes.Equal(buf, snap[o:o+badChunk]) {
				wrong++
				t.Errorf("chunk at %d reads back different data", o)
			}
			if lost(o) {
				t.Errorf("chunk at %d read without error, but no copy of it is readable", o)
			}
			continue
		}
		for b := o; b < o+badChunk; b += raid10.BlockSize {
			_, err := f.ReadAt(blk, b)
			switch {
			case err == nil && !bytes.Equal(blk, snap[b:b+raid10.BlockSize]):
				wrong++
				t.Errorf("block at %d reads back different data", b)
			case err == nil && lost(b):
				t.Errorf("block at %d read without error, but no copy of it is readable", b)
			case err != nil && !errors.Is(err, syscall.EIO):
				t.Errorf("block at %d: %v, want EIO", b, err)
			case err != nil:
				eio++
				if !lost(b) {
					t.Errorf("block at %d: EIO, but a copy of it is readable", b)
				}
			}
		}
	}
	st = arr.Status()
	figure(t, "both copies unreadable", "%d blocks EIO (want %d), %d read back wrong, status lost %d, members 2 and 3 %s/%s with %d/%d blocks bad, array %s",
		eio, 2*badChunk/raid10.BlockSize, wrong, st.LostBlocks, st.Members[2].State, st.Members[3].State,
		st.Members[2].BadBlocks, st.Members[3].BadBlocks, st.State)
	if eio != 2*badChunk/raid10.BlockSize || st.LostBlocks != int64(eio) {
		t.Errorf("%d blocks failed, status lost %d; want %d", eio, st.LostBlocks, 2*badChunk/raid10.BlockSize)
	}
	if st.Members[2].State != raid10.MemberInSync || st.Members[3].State != raid10.MemberInSync || st.State != raid10.ArrayDegraded {
		t.Errorf("array %s, members %+v: want degraded with both in sync", st.State, st.Members)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Repaired media: a write over the lost chunks clears the marks.
	for _, d := range devs[2:] {
		d.Swap(t, d.Linear())
	}
	for c := lostFrom; c < lostTo; c += 2 * badChunk {
		if _, err := f.WriteAt(snap[c:c+badChunk], c); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	back := aligned(badSize)
	if _, err := f.ReadAt(back, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, snap) {
		t.Error("the device reads back different data after the rewrite")
	}
	if sr, err = arr.Check(ctx); err != nil {
		t.Fatal(err)
	}
	st = arr.Status()
	figure(t, "after the rewrite", "scrub %+v, lost %d, array %s", sr, st.LostBlocks, st.State)
	if sr.Mismatches != 0 || sr.Lost != 0 || st.LostBlocks != 0 || st.State != raid10.ArrayOptimal {
		t.Errorf("after the rewrite: scrub %+v, status %s lost %d", sr, st.State, st.LostBlocks)
	}
}

// aligned returns a page-aligned buffer for O_DIRECT.
func aligned(n int) []byte { return raid10.AlignedBuffer(n) }
