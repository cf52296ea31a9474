package pool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestScrubWindow: when the schedule's windows open and which cycle they belong to.
func TestScrubWindow(t *testing.T) {
	loc := time.UTC
	at := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	// November 2026: Sunday the 1st, 8th; December 2026: Sunday the 6th.
	monthly := ScrubConfig{}.withDefaults()
	weekly := ScrubConfig{Schedule: ScrubWeekly, Start: "22:30", Window: Duration(4 * time.Hour)}.withDefaults()
	for _, tc := range []struct {
		name  string
		c     ScrubConfig
		now   string
		in    bool
		cycle string
	}{
		{"FirstSundayInWindow", monthly, "2026-11-01 01:00", true, "2026-11-01 01:00"},
		{"FirstSundayBeforeWindow", monthly, "2026-11-01 00:59", false, ""},
		{"FirstSundayAfterWindow", monthly, "2026-11-01 07:00", false, ""},
		{"NextNightSameCycle", monthly, "2026-11-02 03:00", true, "2026-11-01 01:00"},
		{"SecondSundaySameCycle", monthly, "2026-11-08 01:30", true, "2026-11-01 01:00"},
		{"LastNightOfCycle", monthly, "2026-12-05 06:59", true, "2026-11-01 01:00"},
		{"NextCycle", monthly, "2026-12-06 01:00", true, "2026-12-06 01:00"},
		{"WeeklyAcrossMidnight", weekly, "2026-11-09 01:00", true, "2026-11-08 22:30"},
		{"WeeklyWindowClosed", weekly, "2026-11-09 02:30", false, ""},
		{"WeeklySaturdayNight", weekly, "2026-11-14 23:00", true, "2026-11-08 22:30"},
		{"Off", ScrubConfig{Schedule: ScrubOff}.withDefaults(), "2026-11-01 02:00", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); err != nil {
				t.Fatal(err)
			}
			in, cycle, _ := scrubWindow(tc.c, at(tc.now))
			if in != tc.in || (tc.in && !cycle.Equal(at(tc.cycle))) {
				t.Fatalf("scrubWindow(%s) = %v, cycle %s; want %v, %s", tc.now, in, cycle, tc.in, tc.cycle)
			}
		})
	}
}

func TestScrubConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    ScrubConfig
		ok   bool
	}{
		{"Defaults", ScrubConfig{}, true},
		{"Weekly", ScrubConfig{Schedule: ScrubWeekly, Start: "23:15", Window: Duration(time.Hour), Repair: true}, true},
		{"BadSchedule", ScrubConfig{Schedule: "daily"}, false},
		{"BadStart", ScrubConfig{Start: "1am"}, false},
		{"NegativeWindow", ScrubConfig{Window: Duration(-time.Hour)}, false},
		{"LongWindow", ScrubConfig{Window: Duration(25 * time.Hour)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
				t.Fatalf("Validate() = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// scrubPool opens a pool of 4 file disks with volume "v" (64 MiB) full of random data.
func scrubPool(t *testing.T, cfg func(*Config)) (*Pool, []string, []byte) {
	t.Helper()
	paths := makeDisks(t, t.TempDir(), 4, testDiskSize)
	c := configFor(paths...)
	c.Scrub.Schedule = ScrubOff // the tests drive the scheduler themselves
	if cfg != nil {
		cfg(&c)
	}
	p := openPool(t, c)
	t.Cleanup(func() { _ = p.Close() })
	if _, err := p.CreateVolume("v", 64<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(64 << 20)
	writeVolume(t, p, "v", data, 0)
	return p, paths, data
}

// corruptSecondCopy overwrites the second copy of the volume's first 4 KiB (member 1's
// first data block: chunk 0 of a near-2 layout lies on members 0 and 1) behind the
// engine's back, after checking that the offset holds that copy.
func corruptSecondCopy(t *testing.T, p *Pool, paths []string, want []byte) {
	t.Helper()
	vi, err := p.Volume("v")
	if err != nil {
		t.Fatal(err)
	}
	m := vi.Members[1]
	f, err := os.OpenFile(m.DiskPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := int64(m.Offset) + extentMetaSize
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want[:4096]) {
		t.Fatalf("member 1's data at disk offset %d is not the volume's first block", off)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 4096), off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// waitScrub waits until volume v's scrub has left Running.
func waitScrub(t *testing.T, p *Pool) ScrubInfo {
	t.Helper()
	var s *ScrubInfo
	waitUntil(t, time.Minute, func() (bool, string) {
		s = volumeInfo(t, p, "v").Scrub
		return s != nil && s.State != ScrubRunning, fmt.Sprintf("scrub still running after a minute: %+v", s)
	})
	return *s
}

// TestScrubFindsAndRepairsMismatches: a check counts a block whose copies differ and
// reports it (state, counter, event); repair rewrites it; the next check finds none.
func TestScrubFindsAndRepairsMismatches(t *testing.T) {
	p, paths, data := scrubPool(t, nil)
	corruptSecondCopy(t, p, paths, data)
	drain(p)
	for _, tc := range []struct {
		kind       ScrubKind
		mismatches int64
		repaired   int64
		total      int64
		event      EventKind
	}{
		{ScrubCheck, 1, 0, 1, EventScrubMismatches},
		{ScrubCheck, 1, 0, 2, EventScrubMismatches}, // a check changes nothing
		{ScrubRepair, 1, 1, 3, EventScrubMismatches},
		{ScrubCheck, 0, 0, 3, EventScrubFinished},
	} {
		if _, err := p.StartScrub("v", tc.kind); err != nil {
			t.Fatal(err)
		}
		s := waitScrub(t, p)
		if s.State != ScrubDone || s.Kind != tc.kind || s.Mismatches != tc.mismatches || s.Repaired != tc.repaired ||
			s.MismatchesTotal != tc.total || s.Done != s.Total || s.Total != 64<<20 || s.LastCompleted == nil || s.Finished == nil {
			t.Fatalf("%s: %+v, want %d mismatches, %d repaired, %d in all", tc.kind, s, tc.mismatches, tc.repaired, tc.total)
		}
		if e := nextEvent(t, p, tc.event); e.Volume != "v" {
			t.Fatalf("event %+v", e)
		}
	}
	checkVolume(t, p, "v", data, 0)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// drain empties the pool's event channel.
func drain(p *Pool) {
	for {
		select {
		case <-p.Events():
		default:
			return
		}
	}
}

// nextEvent returns the next event of kind, skipping others.
func nextEvent(t *testing.T, p *Pool, kind EventKind) Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-p.Events():
			if e.Kind == kind {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s event", kind)
		}
	}
}

// TestScrubRefusals: the errors of StartScrub and StopScrub.
func TestScrubRefusals(t *testing.T) {
	p, paths, _ := scrubPool(t, func(c *Config) { c.RebuildRateMax = 8 << 20 }) // 8 s a pass
	if _, err := p.StartScrub("v", ScrubCheck); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"unknown volume", second(p.StartScrub("nope", ScrubCheck)), ErrNotFound},
		{"bad kind", second(p.StartScrub("v", "verify")), ErrInvalidArgument},
		{"other kind running", second(p.StartScrub("v", ScrubRepair)), ErrFailedPrecondition},
		{"same kind running", second(p.StartScrub("v", ScrubCheck)), nil},
		{"stop unknown", second(p.StopScrub("nope")), ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) || (tc.want == nil) != (tc.err == nil) {
				t.Fatalf("%v, want %v", tc.err, tc.want)
			}
		})
	}
	time.Sleep(time.Second) // some progress
	s, err := p.StopScrub("v")
	if err != nil || s.State != ScrubPaused || s.Finished == nil || s.Done >= s.Total || s.Done == 0 || s.Resume != s.Done {
		t.Fatalf("StopScrub: %+v %v", s, err)
	}
	// A start of the same kind continues where it stopped, keeping the pass's start.
	r, err := p.StartScrub("v", ScrubCheck)
	if err != nil || r.From != s.Resume || !r.Started.Equal(s.Started) {
		t.Fatalf("resumed: %+v %v, paused at %d", r, err, s.Resume)
	}
	if d := waitScrub(t, p); d.State != ScrubDone || d.Done != d.Total || d.From != s.Resume {
		t.Fatalf("resumed pass: %+v", d)
	}
	if err := p.FailDisk(paths[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.StartScrub("v", ScrubCheck); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("scrub of a Degraded volume: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }

// TestScrubSchedule drives the scheduler's clock through a cycle: the first window starts a
// check of every volume, its end pauses an unfinished one, the next night continues it,
// and a volume scrubbed in this cycle is left alone until the next.
func TestScrubSchedule(t *testing.T) {
	p, _, _ := scrubPool(t, func(c *Config) { c.RebuildRateMax = 16 << 20 }) // 4 s a pass
	c := ScrubConfig{}.withDefaults()
	// Dates of 2037 (the calendar of 2026 again): after the volumes' creation, which a
	// cycle's first check skips (TestScrubScheduleSkipsNewVolumes).
	at := func(s string) time.Time {
		tm, _ := time.ParseInLocation("2006-01-02 15:04", s, time.Local)
		return tm
	}
	state := func() *ScrubInfo {
		vi, _ := p.Volume("v")
		return vi.Scrub
	}
	p.scheduleOnce(c, at("2037-10-31 02:00")) // a Saturday night of the last cycle: nothing ran yet, so it starts
	if s := state(); s == nil || s.State != ScrubRunning || !s.Scheduled || s.Kind != ScrubCheck {
		t.Fatalf("after the window opened: %+v", s)
	}
	time.Sleep(time.Second)                   // some progress
	p.scheduleOnce(c, at("2037-10-31 07:00")) // the window closes
	paused := state()
	if paused.State != ScrubPaused || paused.Resume == 0 {
		t.Fatalf("after the window closed: %+v", paused)
	}
	p.scheduleOnce(c, at("2037-10-31 12:00"))
	if s := state(); s.State != ScrubPaused {
		t.Fatalf("outside the window: %+v", s)
	}
	// Sunday 2037-11-01 is a new cycle (the first Sunday), so to see a continuation, pause
	// again in the first night of it and continue the next night.
	p.scheduleOnce(c, at("2037-11-01 01:00")) // a new cycle: from the start
	if s := state(); s.State != ScrubRunning || s.From != 0 {
		t.Fatalf("in the next cycle's first window: %+v", s)
	}
	time.Sleep(time.Second)
	p.scheduleOnce(c, at("2037-11-01 07:00"))
	paused = state()
	if paused.State != ScrubPaused || paused.Resume == 0 {
		t.Fatalf("after the first window of the cycle: %+v", paused)
	}
	p.scheduleOnce(c, at("2037-11-02 01:00")) // the next night: where it stopped
	if s := state(); s.State != ScrubRunning || s.From != paused.Resume {
		t.Fatalf("the next night: %+v, paused at %d", s, paused.Resume)
	}
	if s := waitScrub(t, p); s.State != ScrubDone {
		t.Fatalf("scheduled scrub: %+v", s)
	}
	done := *state().LastCompleted
	p.scheduleOnce(c, at("2037-11-02 01:30")) // done in this cycle: left alone
	if s := state(); s.State != ScrubDone || !s.LastCompleted.Equal(done) {
		t.Fatalf("a second scrub in one cycle: %+v", s)
	}

	// After a restart the agent restores the last completion (status.scrub): the cycle's
	// check is not repeated; without it, it would be.
	if _, err := p.CreateVolume("w", 16<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.RecordScrubCompleted("w", at("2037-11-01 02:00")); err != nil {
		t.Fatal(err)
	}
	if err := p.RecordScrubCompleted("nope", at("2037-11-01 02:00")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("RecordScrubCompleted of an unknown volume: %v", err)
	}
	p.scheduleOnce(c, at("2037-11-03 01:30"))
	if vi, _ := p.Volume("w"); vi.Scrub != nil {
		t.Fatalf("a volume checked in this cycle before the restart was scrubbed again: %+v", vi.Scrub)
	}
	p.scheduleOnce(c, at("2037-12-06 01:30")) // the next cycle
	if vi, _ := p.Volume("w"); vi.Scrub == nil || !vi.Scrub.Scheduled {
		t.Fatalf("next cycle: %+v", vi.Scrub)
	}
}

// TestScrubScheduleSkipsNewVolumes: a volume created in the current cycle is not checked in
// its windows (both copies were written from the start); the next cycle checks it. Otherwise
// every volume a test creates between 01:00 and 07:00 (the default window) would be scrubbed
// a minute later, and tests would behave differently at night.
func TestScrubScheduleSkipsNewVolumes(t *testing.T) {
	p, _, _ := scrubPool(t, nil)
	c := ScrubConfig{}.withDefaults()
	// A window of the cycle that holds the creation: last night's (or this night's, once
	// it opened); its cycle began before it.
	now := time.Now()
	night := time.Date(now.Year(), now.Month(), now.Day(), 1, 30, 0, 0, time.Local)
	if night.After(now) {
		night = night.AddDate(0, 0, -1)
	}
	if in, cycle, _ := scrubWindow(c, night); !in || cycle.After(now) {
		t.Fatalf("test clock: %v is not in the cycle of now (in %v, cycle %v)", night, in, cycle)
	}
	p.scheduleOnce(c, night)
	if vi, _ := p.Volume("v"); vi.Scrub != nil {
		t.Fatalf("a volume created in this cycle was scrubbed at %v: %+v", night, vi.Scrub)
	}
	// The next cycle: the first Sunday of the next month.
	next := time.Date(night.Year(), night.Month()+1, 1, 1, 30, 0, 0, time.Local)
	for next.Weekday() != time.Sunday {
		next = next.AddDate(0, 0, 1)
	}
	p.scheduleOnce(c, next)
	if vi, _ := p.Volume("v"); vi.Scrub == nil || !vi.Scrub.Scheduled {
		t.Fatalf("the next cycle (%v) did not scrub it: %+v", next, vi.Scrub)
	}
}

// TestScrubVsRebuildRate measures a check and a rebuild of the same volume on the same file
// disks, at the engine's default ceiling (raid10.DefaultSyncRateMax, 200,000 KiB/s) and
// unthrottled, and logs both rates. A measurement, not a timed pass/fail test: it fails only
// if either does not finish.
func TestScrubVsRebuildRate(t *testing.T) {
	const size = 192 << 20
	for _, tc := range []struct {
		name    string
		rateMax int64
	}{
		{"DefaultCeiling", 0},
		{"Unthrottled", 1 << 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			paths := makeDisks(t, dir, 5, testDiskSize)
			c := configFor(paths[:4]...)
			c.Scrub.Schedule, c.RebuildRateMax = ScrubOff, tc.rateMax
			p := openPool(t, c)
			defer p.Close()
			if _, err := p.CreateVolume("v", size, CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			writeVolume(t, p, "v", randBytes(size), 0) // real data: holes would read for free

			start := time.Now()
			if _, err := p.StartScrub("v", ScrubCheck); err != nil {
				t.Fatal(err)
			}
			s := waitScrub(t, p)
			scrubTime := time.Since(start)
			if s.State != ScrubDone || s.Mismatches != 0 {
				t.Fatalf("check: %+v", s)
			}

			if err := p.FailDisk(paths[1]); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			if _, err := p.ReplaceDisk(paths[1], DiskConfig{Path: paths[4]}); err != nil {
				t.Fatal(err)
			}
			waitHealth(t, p, "v", Healthy)
			rebuildTime := time.Since(start)
			a, _ := p.Array("v")
			rebuilt := a.Status().Sync.Total // the chunks with a copy on the new member

			mib := func(b int64, d time.Duration) float64 { return float64(b) / float64(1<<20) / d.Seconds() }
			t.Logf("check: %d MiB of array in %v = %.0f MiB/s (reads both copies: %.0f MiB/s from the disks)",
				s.Total>>20, scrubTime.Round(time.Millisecond), mib(s.Total, scrubTime), 2*mib(s.Total, scrubTime))
			t.Logf("rebuild: %d MiB onto the new disk in %v = %.0f MiB/s (one read and one write each)",
				rebuilt>>20, rebuildTime.Round(time.Millisecond), mib(rebuilt, rebuildTime))
			t.Logf("check/rebuild rate (array bytes per second): %.2f", mib(s.Total, scrubTime)/mib(rebuilt, rebuildTime))
		})
	}
}

// TestScrubBacksOffUnderIO: a check of a volume that serves writes meanwhile completes
// and lets them through (the engine's throttle falls back towards SyncRateMin while
// foreground I/O runs). The rates, idle and busy, are logged as figures to compare within
// one run; speed is not asserted.
func TestScrubBacksOffUnderIO(t *testing.T) {
	p, _, _ := scrubPool(t, func(c *Config) { c.RebuildRateMax = 1 << 40 })
	arr, err := p.Array("v")
	if err != nil {
		t.Fatal(err)
	}
	check := func() float64 {
		t.Helper()
		start := time.Now()
		if _, err := p.StartScrub("v", ScrubCheck); err != nil {
			t.Fatal(err)
		}
		s := waitScrub(t, p)
		if s.State != ScrubDone {
			t.Fatalf("check: %+v", s)
		}
		return float64(s.Total) / (1 << 20) / time.Since(start).Seconds()
	}
	idle := check()

	stop := make(chan struct{})
	writes := make(chan int, 1)
	go func() {
		buf := randBytes(4096)
		n := 0
		for {
			select {
			case <-stop:
				writes <- n
				return
			default:
			}
			if _, err := arr.WriteAt(buf, int64(n%4096)*4096+32<<20); err != nil {
				t.Error(err)
			}
			n++
		}
	}()
	busy := check()
	close(stop)
	n := <-writes
	// A figure, not a pass/fail: speed on a shared machine is no test (under load the
	// ratio varies severalfold between runs). The back-off itself is the engine's throttle.
	t.Logf("check of 64 MiB: idle %.0f MiB/s, under %d foreground writes %.0f MiB/s (ratio %.2f; floor %d KiB/s)", idle, n, busy, busy/idle, 1000)
	if n == 0 {
		t.Fatal("no foreground write completed during the check")
	}
}
