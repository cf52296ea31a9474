package pool

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestVolumeScrubSchedule: a volume with a schedule of its own is scrubbed by it while the
// node's schedule is off (and another volume is not), with its own kind (repair); a window
// of its schedule that closes pauses it; back on the node's (nil), a scheduled scrub in
// flight is paused; a bad schedule is ErrInvalidArgument naming the field and an unknown
// volume ErrNotFound.
func TestVolumeScrubSchedule(t *testing.T) {
	p, _, _ := scrubPool(t, func(c *Config) { c.RebuildRateMax = 16 << 20 }) // node: off
	if _, err := p.CreateVolume("w", 16<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := p.cfg.Scrub.withDefaults()
	at := func(s string) time.Time {
		tm, _ := time.ParseInLocation("2006-01-02 15:04", s, time.Local)
		return tm
	}
	state := func(name string) *ScrubInfo {
		vi, err := p.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		return vi.Scrub
	}
	for _, tc := range []struct {
		name, vol, mention string
		c                  *ScrubConfig
		is                 error
	}{
		{"BadSchedule", "v", "scrub.schedule", &ScrubConfig{Schedule: "daily"}, ErrInvalidArgument},
		{"BadWindow", "v", "scrub.window", &ScrubConfig{Window: Duration(25 * time.Hour)}, ErrInvalidArgument},
		{"UnknownVolume", "nope", `"nope"`, &ScrubConfig{}, ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := p.SetVolumeScrubSchedule(tc.vol, tc.c); !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("SetVolumeScrubSchedule(%q, %+v) = %v, want %v naming %s", tc.vol, tc.c, err, tc.is, tc.mention)
			}
		})
	}
	if p.ownScrubSchedules() {
		t.Fatal("a refused schedule was kept")
	}

	// Sunday 2037-11-08 is no first Sunday: a weekly schedule starts a cycle, a monthly one
	// would not. The window opens at 22:00 for 2 hours.
	if err := p.SetVolumeScrubSchedule("v", &ScrubConfig{Schedule: ScrubWeekly, Start: "22:00", Window: Duration(2 * time.Hour), Repair: true}); err != nil {
		t.Fatal(err)
	}
	if !p.ownScrubSchedules() {
		t.Fatal("the scheduler would not look: no volume has a schedule of its own")
	}
	p.scheduleOnce(node, at("2037-11-08 21:00")) // before its window
	if s := state("v"); s != nil {
		t.Fatalf("before the volume's window: %+v", s)
	}
	p.scheduleOnce(node, at("2037-11-08 22:30"))
	if s := state("v"); s == nil || s.State != ScrubRunning || !s.Scheduled || s.Kind != ScrubRepair {
		t.Fatalf("in the volume's window: %+v, want a scheduled repair running", s)
	}
	if s := state("w"); s != nil {
		t.Fatalf("a volume on the node's schedule (off) was scrubbed: %+v", s)
	}
	p.scheduleOnce(node, at("2037-11-09 00:30")) // its window closed
	if s := state("v"); s.State != ScrubPaused {
		t.Fatalf("after the volume's window: %+v", s)
	}
	p.scheduleOnce(node, at("2037-11-09 22:15")) // the next night: continues
	if s := state("v"); s.State != ScrubRunning {
		t.Fatalf("the next night: %+v", s)
	}
	if err := p.SetVolumeScrubSchedule("v", nil); err != nil {
		t.Fatal(err)
	}
	p.scheduleOnce(node, at("2037-11-09 22:16")) // back on the node's (off): paused
	if s := state("v"); s.State != ScrubPaused {
		t.Fatalf("back on the node's schedule: %+v", s)
	}
	if p.ownScrubSchedules() {
		t.Fatal("the volume still has a schedule of its own")
	}
}
