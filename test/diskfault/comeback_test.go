package diskfault

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

const (
	// cbSize is the comeback array's size: small, so that the rate-limited full rebuild
	// and the scrubs stay short.
	cbSize = 128 << 20
	// cbRegion is its bitmap region: small against the array, so that a re-add after
	// writes to a part of it copies only that part.
	cbRegion = 2 << 20
	// cbRate is the sync rate ceiling: the full rebuild of a member (cbSize/2 array
	// bytes) takes at least 12.8 s, long enough for another member to go away, come
	// back and be re-added while it runs.
	cbRate = 5 << 20
	// cbArea is the part of the array fio writes (two jobs, half each).
	cbArea = 16 << 20
	// cbFirst is the first brd ramdisk of the test (4 members and a spare).
	cbFirst = 8
)

// TestComebackInGuest: a disk that goes away and comes back (a loose cable, a controller
// reset), under fio writing and verifying on the raw /dev/nbdX of a RAID10 of 4 dm-linear
// members with a small bitmap region.
//
// Phase 1: member 1 becomes an `error` target; the engine fails it and fio goes on from
// the other copies. Back to `linear`, it is re-added (AddMember, the same member): a
// bitmap-based recovery copies only the dirty regions, strictly less than a full rebuild
// of the member (the chunks it holds: half the array). fio: 0 errors; a scrub: 0
// mismatches.
//
// Phase 2: member 0 is failed and replaced by a blank disk (a full rebuild, rate limited
// to cbRate); while it runs member 2 (not member 0's mirror partner: every chunk keeps a
// copy) goes away and comes back and is re-added. Both recoveries end (the spare's full
// one, then the re-add's bitmap one); fio: 0 errors; a scrub: 0 mismatches.
func TestComebackInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestDiskFaultVM")
	vm.RequireTools(t, "dmsetup", "fio")
	devs := newDM(t, "r10cb", cbFirst, 5)
	members, files := openMembers(t, devs[:4])
	_, spares := openMembers(t, devs[4:])
	arr, err := raid10.Create(members, raid10.CreateOptions{AssumeClean: true, Size: cbSize, RegionSize: cbRegion,
		Options: raid10.Options{MemberTimeout: slowDeadline, SyncRateMax: cbRate}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { arr.Close() })
	dev := serve(t, arr, "vol-comeback")
	st := arr.Status()
	// Near-2 over 4 members: each member holds a copy of half the array's chunks.
	share := st.Size / 2
	t.Logf("array %d MiB, chunk %d KiB, bitmap region %d KiB, sync rate ceiling %d MiB/s; a member's share %d MiB",
		st.Size>>20, st.ChunkSize>>10, st.RegionSize>>10, cbRate>>20, share>>20)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Phase 1: member 1 goes away and comes back.
	const gone1 = 1
	f1 := startFio(t, dev, "p1", 25*time.Second)
	f1.warm(t, arr)
	goneAt, failedAt := goAway(t, arr, devs[gone1], gone1)
	time.Sleep(2 * time.Second)
	back, added, slot := comeBack(t, arr, devs[gone1], files[gone1])
	if slot != gone1 {
		t.Fatalf("re-added into slot %d, want %d", slot, gone1)
	}
	sm := watchSync(arr)
	if err := arr.WaitSync(ctx); err != nil {
		t.Fatalf("re-add of member %d: %v", gone1, err)
	}
	synced := time.Now()
	passes := sm.stop(arr)
	res := f1.wait(t)
	figure(t, "phase 1: member gone", "failed %v after the switch to error", failedAt.Sub(goneAt).Round(time.Millisecond))
	if len(passes) != 1 {
		t.Fatalf("phase 1: %d recovery passes %+v, want 1", len(passes), passes)
	}
	readd := passes[0]
	figure(t, "phase 1: re-add resync", "%d KiB copied (Total %d KiB) in %v (re-add %v after the switch back); a full rebuild of the member: %d KiB (%.1f%%)",
		readd.Done>>10, readd.Total>>10, synced.Sub(added).Round(time.Millisecond), added.Sub(back).Round(time.Millisecond),
		share>>10, 100*float64(readd.Total)/float64(share))
	if readd.Total <= 0 || readd.Total >= share || readd.Done != readd.Total {
		t.Errorf("phase 1: re-add copied %d of %d bytes; a full rebuild copies %d", readd.Done, readd.Total, share)
	}
	fioFigure(t, "phase 1", res)
	checkOptimal(t, arr, "phase 1")
	scrub(t, ctx, arr, "phase 1")
	if t.Failed() {
		t.FailNow()
	}

	// Phase 2: member 0 rebuilt onto a blank spare; member 2 goes away and comes back
	// meanwhile.
	const replaced, gone2 = 0, 2
	f2 := startFio(t, dev, "p2", 30*time.Second)
	f2.warm(t, arr)
	sm = watchSync(arr)
	if err := arr.FailMember(replaced); err != nil {
		t.Fatal(err)
	}
	if err := arr.ReplaceMember(replaced, spares[0]); err != nil {
		t.Fatal(err)
	}
	replacedAt := time.Now()
	time.Sleep(time.Second)
	goneAt, failedAt = goAway(t, arr, devs[gone2], gone2)
	time.Sleep(time.Second)
	back, added, slot = comeBack(t, arr, devs[gone2], files[gone2])
	if slot != gone2 {
		t.Fatalf("re-added into slot %d, want %d", slot, gone2)
	}
	st = arr.Status()
	during := st.Members[replaced].State == raid10.MemberRecovering && st.Sync.Running && st.Sync.Kind == raid10.SyncRecovery
	figure(t, "phase 2: member gone and back during the rebuild", "failed %v after the switch to error; re-added %v after the switch back, %v into the spare's rebuild (%d of %d KiB done, running %v)",
		failedAt.Sub(goneAt).Round(time.Millisecond), added.Sub(back).Round(time.Millisecond), added.Sub(replacedAt).Round(time.Millisecond),
		st.Sync.Done>>10, st.Sync.Total>>10, during)
	if !during {
		t.Errorf("phase 2: the spare's rebuild was no longer running when member %d was re-added: %+v, %+v", gone2, st.Sync, st.Members)
	}
	if err := arr.WaitSync(ctx); err != nil {
		t.Fatalf("phase 2 recoveries: %v", err)
	}
	synced = time.Now()
	passes = sm.stop(arr)
	res = f2.wait(t)
	if len(passes) != 2 {
		t.Fatalf("phase 2: %d recovery passes %+v, want 2 (the spare's, then the re-add's)", len(passes), passes)
	}
	full, readd2 := passes[0], passes[1]
	figure(t, "phase 2: full rebuild onto the spare", "%d KiB copied (Total %d KiB), %v", full.Done>>10, full.Total>>10, full.took.Round(time.Millisecond))
	figure(t, "phase 2: re-add resync after it", "%d KiB copied (Total %d KiB) in %v (%.1f%% of the full rebuild); both done %v after the replacement",
		readd2.Done>>10, readd2.Total>>10, readd2.took.Round(time.Millisecond), 100*float64(readd2.Total)/float64(full.Total),
		synced.Sub(replacedAt).Round(time.Millisecond))
	if full.Total != share || full.Done != full.Total {
		t.Errorf("phase 2: full rebuild copied %d of %d bytes, want the member's share %d", full.Done, full.Total, share)
	}
	if readd2.Total <= 0 || readd2.Total >= full.Total || readd2.Done != readd2.Total {
		t.Errorf("phase 2: re-add copied %d of %d bytes; the full rebuild copied %d", readd2.Done, readd2.Total, full.Total)
	}
	if readd.Total >= full.Total {
		t.Errorf("phase 1's re-add copied %d bytes, not less than the full rebuild's %d", readd.Total, full.Total)
	}
	fioFigure(t, "phase 2", res)
	checkOptimal(t, arr, "phase 2")
	scrub(t, ctx, arr, "phase 2")
}

// goAway switches d (slot i of arr) to an `error` table and waits for the engine to fail
// the member under fio's writes. It returns when the switch began and when the member
// was seen faulty.
func goAway(t *testing.T, arr *raid10.Array, d vm.DMDisk, i int) (gone, failed time.Time) {
	t.Helper()
	gone, _ = d.Swap(t, d.Dead())
	for {
		st := arr.Status()
		if st.Members[i].State == raid10.MemberFaulty {
			failed = time.Now()
			t.Logf("member %d faulty: %+v; array %s", i, st.Members[i], st.State)
			if st.State != raid10.ArrayDegraded {
				t.Errorf("array %s with member %d gone, want degraded", st.State, i)
			}
			return gone, failed
		}
		if time.Since(gone) > 20*time.Second {
			t.Fatalf("member %d not failed 20 s after it went away: %+v", i, st.Members[i])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// comeBack switches d back to linear and re-adds its member m (the same FileMember,
// as a disk that reappears under the same name), retrying while requests from before
// the failure are outstanding. It returns when the switch ended, when the re-add was
// accepted and the slot.
func comeBack(t *testing.T, arr *raid10.Array, d vm.DMDisk, m *raid10.FileMember) (back, added time.Time, slot int) {
	t.Helper()
	_, back = d.Swap(t, d.Linear())
	for {
		slot, err := arr.AddMember(m)
		if err == nil {
			return back, time.Now(), slot
		}
		if !errors.Is(err, raid10.ErrBusy) || time.Since(back) > 20*time.Second {
			t.Fatalf("re-add %s: %v", d.Path(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pass is one recovery pass seen in Status().Sync.
type pass struct {
	raid10.SyncProgress
	took time.Duration
}

// syncWatch samples Status().Sync and splits the recoveries it sees into passes (a new
// pass begins when Total changes or Done goes back).
type syncWatch struct {
	mu     sync.Mutex
	passes []pass
	begun  time.Time
	quit   chan struct{}
	done   chan struct{}
}

func watchSync(arr *raid10.Array) *syncWatch {
	w := &syncWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			w.sample(arr.Status().Sync)
			select {
			case <-w.quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *syncWatch) sample(p raid10.SyncProgress) {
	if p.Kind != raid10.SyncRecovery || p.Total == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(w.passes)
	if n == 0 || w.passes[n-1].Total != p.Total || p.Done < w.passes[n-1].Done {
		if n == 0 && !p.Running {
			return // the last pass of before
		}
		w.passes = append(w.passes, pass{SyncProgress: p})
		w.begun = time.Now()
		return
	}
	if p.Done != w.passes[n-1].Done || p.Running != w.passes[n-1].Running {
		took := w.passes[n-1].took
		if w.passes[n-1].Running {
			took = time.Since(w.begun)
		}
		w.passes[n-1] = pass{SyncProgress: p, took: took}
	}
}

// stop ends the sampling after one last sample and returns the passes seen.
func (w *syncWatch) stop(arr *raid10.Array) []pass {
	close(w.quit)
	<-w.done
	w.sample(arr.Status().Sync)
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]pass(nil), w.passes...)
}

// fioRun is fio writing and verifying (verify_backlog) the first cbArea bytes of the
// raw device, time based.
type fioRun struct {
	out  string
	cmd  *exec.Cmd
	log  *strings.Builder
	done chan error
}

func startFio(t *testing.T, dev, name string, runtime time.Duration) *fioRun {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".json")
	// Two jobs over halves of the area, so that reads (verify) and writes are both in
	// flight whenever a member goes away: fio stops writing while it verifies a backlog,
	// a short one in the first job, a long one in the second.
	cmd := exec.Command("fio", "--filename="+dev, "--bs=4k", "--rw=randwrite",
		"--ioengine=libaio", "--iodepth=8", "--direct=1",
		"--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
		"--time_based", fmt.Sprintf("--runtime=%d", int(runtime.Seconds())), "--group_reporting",
		"--output-format=json", "--output="+out,
		"--name="+name+"a", "--offset=0", fmt.Sprintf("--size=%d", cbArea/2), "--verify_backlog=16",
		"--name="+name+"b", fmt.Sprintf("--offset=%d", cbArea/2), fmt.Sprintf("--size=%d", cbArea/2), "--verify_backlog=1024")
	f := &fioRun{out: out, cmd: cmd, log: &strings.Builder{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = f.log, f.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { f.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-f.done
		}
	})
	return f
}

// warm waits until fio has written for a while at full speed.
func (f *fioRun) warm(t *testing.T, arr *raid10.Array) {
	t.Helper()
	w0 := arr.Status().WriteOps
	for arr.Status().WriteOps < w0+100 {
		select {
		case err := <-f.done:
			t.Fatalf("fio ended early: %v\n%s", err, f.log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	time.Sleep(2 * time.Second)
}

func (f *fioRun) wait(t *testing.T) fioResult {
	t.Helper()
	if err := <-f.done; err != nil {
		t.Errorf("fio: %v\n%s", err, f.log.String())
	}
	return readFio(t, f.out)
}

func fioFigure(t *testing.T, phase string, res fioResult) {
	t.Helper()
	figure(t, phase+": fio", "%d errors; %d writes (%d MiB), %d verify reads (%d MiB); max completion latency write %v, read %v",
		res.Error, res.WriteBytes/4096, res.WriteBytes>>20, res.ReadBytes/4096, res.ReadBytes>>20,
		res.WriteClatMax.Round(time.Millisecond), res.ReadClatMax.Round(time.Millisecond))
	if res.Error != 0 {
		t.Errorf("%s: fio error %d", phase, res.Error)
	}
	if res.ReadBytes == 0 || res.WriteBytes == 0 {
		t.Errorf("%s: fio wrote %d and verified %d bytes", phase, res.WriteBytes, res.ReadBytes)
	}
}

func checkOptimal(t *testing.T, arr *raid10.Array, phase string) {
	t.Helper()
	st := arr.Status()
	if st.State != raid10.ArrayOptimal {
		t.Errorf("%s: array %s: %+v", phase, st.State, st.Members)
	}
	for i, m := range st.Members {
		if m.State != raid10.MemberInSync {
			t.Errorf("%s: member %d %s", phase, i, m.State)
		}
	}
}

// scrub checks the whole array, without the sync rate ceiling that stretches the rebuilds
// (cbRate: the scrub of a phase's end took 25.6 s at it; issue 24). What it checks, every
// block's copies equal and none lost, does not depend on its speed.
func scrub(t *testing.T, ctx context.Context, arr *raid10.Array, phase string) {
	t.Helper()
	r := arr.Rates()
	r.ScrubMax = -1
	if err := arr.SetRates(r); err != nil {
		t.Fatalf("%s: %v", phase, err)
	}
	start := time.Now()
	sr, err := arr.Check(ctx)
	if err != nil {
		t.Fatalf("%s: scrub: %v", phase, err)
	}
	figure(t, phase+": scrub", "%d mismatches, %d lost blocks, %d MiB compared in %v",
		sr.Mismatches, sr.Lost, sr.Checked>>20, time.Since(start).Round(time.Millisecond))
	if sr.Mismatches != 0 || sr.Lost != 0 || sr.Checked != arr.Size() {
		t.Errorf("%s: scrub %+v (array %d bytes)", phase, sr, arr.Size())
	}
}
