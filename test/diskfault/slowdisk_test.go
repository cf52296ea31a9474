package diskfault

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

const (
	// slowDeadline is the member deadline of the slow-disk test, short to keep it short.
	slowDeadline = 1500 * time.Millisecond
	// slowDelay is how long the slow member holds each request: far above the deadline.
	slowDelay = 30 * time.Second
	// fioRuntime is how long fio writes and verifies; the stall starts a few seconds in.
	fioRuntime = 20 * time.Second
	slowMember = 1
)

// TestSlowDiskInGuest: fio writes and verifies (verify_backlog: every block written is
// read back and checked while the writes go on) through ext4 on /dev/nbdX over a RAID10
// of 4 dm-linear members; a few seconds in, member 1 becomes a dm-delay target holding
// every request 30 s, 20 times the 1.5 s member deadline. The engine must fail it at
// the deadline and complete the stuck requests from the other copy: no fio error,
// completion latency at most the deadline plus 1 s. Then the member is switched back to
// linear, re-added and rebuilt, a scrub finds no mismatch and e2fsck finds the file
// system clean.
func TestSlowDiskInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestDiskFaultVM")
	vm.RequireTools(t, "dmsetup", "fio", "mkfs.ext4", "e2fsck")
	devs := newDM(t, "r10slow", 0, 4)
	members, files := openMembers(t, devs)
	arr, err := raid10.Create(members, raid10.CreateOptions{AssumeClean: true,
		Options: raid10.Options{MemberTimeout: slowDeadline}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { arr.Close() })
	dev := serve(t, arr, "vol-slow")
	vm.Sh(t, "mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", dev)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	vm.Sh(t, "mount", "-t", "ext4", dev, mnt)
	mounted := true
	umount := func() {
		if mounted {
			vm.Sh(t, "umount", mnt)
			mounted = false
		}
	}
	t.Cleanup(umount)

	// Watch the array for the slow member's failure.
	var (
		mu     sync.Mutex
		failed time.Time
	)
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if st := arr.Status(); st.Members[slowMember].State != raid10.MemberInSync {
				mu.Lock()
				if failed.IsZero() {
					failed = time.Now()
				}
				mu.Unlock()
			}
		}
	}()

	logs := t.TempDir()
	out := filepath.Join(logs, "fio.json")
	// Two jobs, so that reads and writes are both in flight whenever the stall begins:
	// fio stops writing while it verifies a backlog, a short one in "mixed", a long one in
	// "writes". Every block written is read back and checked.
	fio := exec.Command("fio", "--directory="+mnt, "--size=32M", "--bs=4k", "--rw=randwrite",
		"--ioengine=libaio", "--iodepth=8", "--direct=1",
		"--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
		"--time_based", fmt.Sprintf("--runtime=%d", int(fioRuntime.Seconds())), "--group_reporting",
		"--output-format=json", "--output="+out,
		"--write_iops_log="+filepath.Join(logs, "f"), "--write_lat_log="+filepath.Join(logs, "f"),
		"--log_avg_msec=250", "--log_max_value=1", "--log_unix_epoch=1",
		"--name=mixed", "--verify_backlog=16", "--name=writes", "--verify_backlog=1024")
	var fioErr strings.Builder
	fio.Stdout, fio.Stderr = &fioErr, &fioErr
	w0 := arr.Status().WriteOps
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	// Let fio lay out its file and run for a while at full speed.
	for arr.Status().WriteOps < w0+100 {
		select {
		case err := <-fioDone:
			t.Fatalf("fio ended before the stall: %v\n%s", err, fioErr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	time.Sleep(4 * time.Second)

	stallFrom, stallTo := devs[slowMember].Swap(t, devs[slowMember].Delayed(int(slowDelay/time.Millisecond)))
	t.Logf("member %d is a %v delay target (dmsetup resume took %v)", slowMember, slowDelay, stallTo.Sub(stallFrom).Round(time.Millisecond))

	if err := <-fioDone; err != nil {
		t.Errorf("fio: %v\n%s", err, fioErr.String())
	}
	close(stopWatch)
	<-watchDone
	mu.Lock()
	failedAt := failed
	mu.Unlock()

	// The member's failure: within the deadline of the stall (the deadline monitor ticks
	// at a quarter of it, so a stuck request is seen between 1 and 1.25 deadlines after
	// it started). The stall began while `dmsetup resume` ran.
	st := arr.Status()
	ms := st.Members[slowMember]
	if failedAt.IsZero() || ms.State != raid10.MemberFaulty {
		t.Fatalf("member %d not failed: %+v (array %s)", slowMember, ms, st.State)
	}
	figure(t, "time from the stall to the member's failure", "%v to %v (from the end and the start of dmsetup resume; deadline %v)",
		failedAt.Sub(stallTo).Round(time.Millisecond), failedAt.Sub(stallFrom).Round(time.Millisecond), slowDeadline)
	// The true time lies between the two: failed no earlier than the deadline, no later
	// than the deadline plus 1 s.
	if d := failedAt.Sub(stallFrom); d < slowDeadline {
		t.Errorf("member failed %v after dmsetup resume began, before the deadline %v", d, slowDeadline)
	}
	if d := failedAt.Sub(stallTo); d > slowDeadline+time.Second {
		t.Errorf("member failed %v after the stall began, more than the deadline %v plus 1 s", d, slowDeadline)
	}
	if ms.TimedOut == 0 {
		t.Errorf("member %d failed but no request counted as timed out: %+v", slowMember, ms)
	}
	for i, m := range st.Members {
		if i != slowMember && m.State != raid10.MemberInSync {
			t.Errorf("member %d: %s", i, m.State)
		}
	}
	if st.State != raid10.ArrayDegraded {
		t.Errorf("array %s, want degraded", st.State)
	}

	// What fio saw.
	res := readFio(t, out)
	figure(t, "fio errors", "%d; written %d MiB, verified (read back) %d MiB", res.Error, res.WriteBytes>>20, res.ReadBytes>>20)
	if res.Error != 0 {
		t.Errorf("fio error %d", res.Error)
	}
	if res.ReadBytes == 0 || res.WriteBytes == 0 {
		t.Errorf("fio wrote %d and verified %d bytes", res.WriteBytes, res.ReadBytes)
	}
	figure(t, "fio max completion latency", "write %v, read (verify) %v (deadline %v)",
		res.WriteClatMax.Round(time.Millisecond), res.ReadClatMax.Round(time.Millisecond), slowDeadline)
	if m := max(res.WriteClatMax, res.ReadClatMax); m > slowDeadline+time.Second {
		t.Errorf("fio completion latency %v, more than the deadline %v plus 1 s", m, slowDeadline)
	}
	// IOPS: the jobs' means added; latency: the largest window maximum of either job.
	var iops []fioLog
	var clat fioLog
	for _, job := range []string{"1", "2"} {
		iops = append(iops, readLog(t, filepath.Join(logs, "f_iops."+job+".log")))
		clat = append(clat, readLog(t, filepath.Join(logs, "f_clat."+job+".log"))...)
	}
	stallEnd := stallTo.Add(slowDeadline + time.Second)
	windows := [][2]time.Time{{stallFrom.Add(-3 * time.Second), stallFrom}, {stallFrom, stallEnd}, {stallEnd, stallEnd.Add(4 * time.Second)}}
	// Only writes: fio accounts no IOPS samples to its verify reads.
	var rate [3]float64
	var worst [3][2]time.Duration
	for i, w := range windows {
		for _, l := range iops {
			rate[i] += l.mean(1, w[0], w[1])
		}
		for dir := 0; dir < 2; dir++ {
			worst[i][dir] = clat.maxDur(dir, w[0], w[1])
		}
	}
	figure(t, "write IOPS", "before the stall (3 s) %.0f, during (stall to deadline + 1 s) %.0f, after (4 s) %.0f",
		rate[0], rate[1], rate[2])
	figure(t, "max completion latency write/read per window", "before %v/%v, during %v/%v, after %v/%v",
		worst[0][1], worst[0][0], worst[1][1], worst[1][0], worst[2][1], worst[2][0])
	after := rate[2]
	if after == 0 {
		t.Errorf("no write completed in the 4 s after the deadline plus 1 s")
	}
	if t.Failed() {
		t.FailNow()
	}

	// Back to linear (suspending the delay target releases the requests it held, which
	// the engine had abandoned), re-add, rebuild.
	_, start := devs[slowMember].Swap(t, devs[slowMember].Linear())
	for {
		_, err := arr.AddMember(files[slowMember])
		if err == nil {
			break
		}
		if !errors.Is(err, raid10.ErrBusy) || time.Since(start) > 20*time.Second {
			t.Fatalf("re-add member %d: %v", slowMember, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	added := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := arr.WaitSync(ctx); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	st = arr.Status()
	figure(t, "rebuild", "%v (re-add possible %v after the switch back; %d MiB copied)",
		time.Since(added).Round(time.Millisecond), added.Sub(start).Round(time.Millisecond), st.Sync.Done>>20)
	if st.State != raid10.ArrayOptimal {
		t.Fatalf("array %s after the rebuild: %+v", st.State, st.Members)
	}

	umount()
	scrubStart := time.Now()
	sr, err := arr.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	figure(t, "scrub after the rebuild", "%d mismatches, %d lost blocks, %d MiB compared in %v",
		sr.Mismatches, sr.Lost, sr.Checked>>20, time.Since(scrubStart).Round(time.Millisecond))
	if sr.Mismatches != 0 || sr.Lost != 0 {
		t.Errorf("scrub: %+v", sr)
	}
	vm.Sh(t, "e2fsck", "-f", "-n", dev)
}

// fioResult is what the test reads from fio's JSON output.
type fioResult struct {
	Error                     int
	WriteBytes, ReadBytes     int64
	WriteClatMax, ReadClatMax time.Duration
}

func readFio(t *testing.T, path string) fioResult {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := vm.ParseFio(raw)
	if err != nil || r.Jobs != 1 {
		t.Fatalf("fio output %s: %v (%d jobs)\n%s", path, err, r.Jobs, raw)
	}
	return fioResult{Error: r.Error, WriteBytes: r.Write.IOBytes, ReadBytes: r.Read.IOBytes,
		WriteClatMax: time.Duration(r.Write.Clat.Max), ReadClatMax: time.Duration(r.Read.Clat.Max)}
}

// fioLog is a fio log with unix-epoch timestamps: one sample per window (log_avg_msec),
// the value averaged (IOPS) or the window's maximum (latency, log_max_value).
type fioLog []struct {
	at    time.Time
	value int64
	dir   int // 0 read, 1 write
}

func readLog(t *testing.T, path string) fioLog {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var l fioLog
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ",")
		if len(fs) < 3 {
			continue
		}
		ms, err1 := strconv.ParseInt(strings.TrimSpace(fs[0]), 10, 64)
		v, err2 := strconv.ParseInt(strings.TrimSpace(fs[1]), 10, 64)
		d, err3 := strconv.Atoi(strings.TrimSpace(fs[2]))
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatalf("%s: %q: %v", path, sc.Text(), err)
		}
		l = append(l, struct {
			at    time.Time
			value int64
			dir   int
		}{time.UnixMilli(ms), v, d})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return l
}

// mean is the mean value of the samples of dir in [from, to); 0 without samples.
func (l fioLog) mean(dir int, from, to time.Time) float64 {
	var sum, n int64
	for _, s := range l {
		if s.dir == dir && !s.at.Before(from) && s.at.Before(to) {
			sum += s.value
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n)
}

// maxDur is the largest value (nanoseconds) of the samples of dir in [from, to).
func (l fioLog) maxDur(dir int, from, to time.Time) time.Duration {
	var m int64
	for _, s := range l {
		if s.dir == dir && !s.at.Before(from) && s.at.Before(to) {
			m = max(m, s.value)
		}
	}
	return time.Duration(m).Round(time.Millisecond)
}
