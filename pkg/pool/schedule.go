package pool

import (
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// ScrubConfig is the pool's scrub schedule (Config.Scrub). The defaults follow md on Debian:
// mdadm's checkarray runs a check of every array on the first Sunday of each month, and
// systemd's mdcheck timers run it in a nightly window (01:00 for 6 hours), continuing the
// next night where it stopped until it is done.
type ScrubConfig struct {
	// Schedule is when a new cycle starts: "monthly" (the first Sunday of each month, the
	// default), "weekly" (every Sunday) or "off".
	Schedule string `json:"schedule,omitempty"`
	// Start is the time of day (local, "HH:MM") the nightly window opens; default "01:00".
	Start string `json:"start,omitempty"`
	// Window is how long a scheduled scrub runs each night before it pauses; default 6h.
	Window Duration `json:"window,omitempty"`
	// Repair makes scheduled scrubs repair (rewrite the second copy of differing blocks)
	// instead of check; off by default, as md's checkarray.
	Repair bool `json:"repair,omitempty"`
}

// Scrub schedules.
const (
	ScrubMonthly = "monthly"
	ScrubWeekly  = "weekly"
	ScrubOff     = "off"
)

// Scrub schedule defaults.
const (
	DefaultScrubStart  = "01:00"
	DefaultScrubWindow = 6 * time.Hour
)

func (c ScrubConfig) withDefaults() ScrubConfig {
	if c.Schedule == "" {
		c.Schedule = ScrubMonthly
	}
	if c.Start == "" {
		c.Start = DefaultScrubStart
	}
	if c.Window == 0 {
		c.Window = Duration(DefaultScrubWindow)
	}
	return c
}

// Validate reports the first invalid field.
func (c ScrubConfig) Validate() error {
	c = c.withDefaults()
	switch c.Schedule {
	case ScrubMonthly, ScrubWeekly, ScrubOff:
	default:
		return fmt.Errorf("%w: scrub.schedule %q: must be %s, %s or %s", ErrInvalidArgument, c.Schedule, ScrubMonthly, ScrubWeekly, ScrubOff)
	}
	if _, err := time.Parse("15:04", c.Start); err != nil {
		return fmt.Errorf("%w: scrub.start %q: must be HH:MM", ErrInvalidArgument, c.Start)
	}
	if w := time.Duration(c.Window); w <= 0 || w > 24*time.Hour {
		return fmt.Errorf("%w: scrub.window %s: must be positive and at most 24h", ErrInvalidArgument, w)
	}
	return nil
}

// scrubWindow says whether now lies in a scheduled scrub window and, if so, when the
// current cycle began (the scheduled start of the first window of this cycle) and when
// tonight's window closes. Windows open every day at Start for Window; a cycle starts on
// its scheduled day (the first Sunday of the month, or every Sunday) and lasts until the
// next one, so a scrub that did not finish in the first window continues in the next nights
// of the same cycle. c has its defaults and is valid.
func scrubWindow(c ScrubConfig, now time.Time) (in bool, cycle, closes time.Time) {
	if c.Schedule == ScrubOff {
		return false, time.Time{}, time.Time{}
	}
	hm, _ := time.Parse("15:04", c.Start)
	at := func(d time.Time) time.Time {
		return time.Date(d.Year(), d.Month(), d.Day(), hm.Hour(), hm.Minute(), 0, 0, now.Location())
	}
	open := at(now)
	if open.After(now) {
		open = at(now.AddDate(0, 0, -1)) // the window that opened last night
	}
	closes = open.Add(time.Duration(c.Window))
	if !now.Before(closes) {
		return false, time.Time{}, time.Time{}
	}
	// The cycle's start: the latest scheduled day at or before the window's day.
	day := open
	for i := 0; i < 40; i++ {
		if day.Weekday() == time.Sunday && (c.Schedule == ScrubWeekly || day.Day() <= 7) {
			return true, at(day), closes
		}
		day = day.AddDate(0, 0, -1)
	}
	return false, time.Time{}, time.Time{} // not reached: every month has a first Sunday
}

// scheduleInterval is how often the scheduler looks at the clock.
const scheduleInterval = time.Minute

// scheduler starts the scheduled scrubs, pauses them when their window closes and continues
// them in the next window of the cycle, until each volume has finished one scrub per cycle.
// A volume with a schedule of its own (SetVolumeScrubSchedule) follows that one; with the
// node's schedule off, the scheduler looks only while some volume has one.
func (p *Pool) scheduler() {
	c := p.cfg.Scrub.withDefaults()
	p.every(scheduleInterval, func() {
		if c.Schedule == ScrubOff && !p.ownScrubSchedules() {
			return
		}
		p.scheduleOnce(c, p.now())
	})
}

// SetVolumeScrubSchedule gives the volume called name a scrub schedule of its own, c (the
// fields of the node's Config.Scrub; an empty field takes its default, as there), or with
// c nil returns it to the node's. The scheduler follows it from its next look (within a
// minute): a window that closes, or a schedule turned off, pauses the volume's scheduled
// scrub as the node's schedule does. Like SetVolumeLimits, the pool keeps it in memory
// only; after a restart the caller sets it again. Errors: ErrInvalidArgument naming the
// field, ErrNotFound, ErrClosed.
func (p *Pool) SetVolumeScrubSchedule(name string, c *ScrubConfig) error {
	if c != nil {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("volume %q: %w", name, err)
		}
		d := c.withDefaults()
		c = &d
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.openVolumeLocked(name)
	if err != nil {
		return err
	}
	v.scrubSchedule = c
	return nil
}

// VolumeScrubSchedule is the scrub schedule of its own the volume called name has (defaults
// filled in), nil when it follows the node's. Errors: ErrNotFound, ErrClosed.
func (p *Pool) VolumeScrubSchedule(name string) (*ScrubConfig, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.openVolumeLocked(name)
	if err != nil || v.scrubSchedule == nil {
		return nil, err
	}
	c := *v.scrubSchedule
	return &c, nil
}

// ownScrubSchedules reports whether some volume has a scrub schedule of its own.
func (p *Pool) ownScrubSchedules() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.volumes {
		if v.scrubSchedule != nil {
			return true
		}
	}
	return false
}

// scheduleOnce is one look of the scheduler at time now, c being the node's schedule.
func (p *Pool) scheduleOnce(c ScrubConfig, now time.Time) {
	p.mu.Lock()
	var start, fresh, stop []string
	kinds := map[string]ScrubKind{}
	for u, v := range p.volumes {
		if v.snap {
			continue // scrubbed by name: volumes only
		}
		vc := c
		if v.scrubSchedule != nil {
			vc = *v.scrubSchedule
		}
		in, cycle, _ := scrubWindow(vc, now)
		kinds[v.name] = ScrubCheck
		if vc.Repair {
			kinds[v.name] = ScrubRepair
		}
		r := p.scrubs[u]
		running := r != nil && r.cancel != nil
		switch {
		case running && r.info.Scheduled && !in:
			stop = append(stop, v.name) // the window closed: pause until the next one
		case running || !in:
		case p.lastCompleted(u, r) >= cycle.UnixNano():
			// done in this cycle (a scheduled or a manual scrub)
		case v.arr != nil && !v.arr.Created().Before(cycle):
			// created in this cycle: both copies were written from the start (zeroed,
			// resynced or copied), there is nothing old to check yet
		case !p.lastWindow[u].Equal(cycle): // a new cycle: from the start
			fresh = append(fresh, v.name)
			p.lastWindow[u] = cycle
		case r != nil && r.info.State == ScrubPaused && r.info.Scheduled: // the next night: where it stopped
			start = append(start, v.name)
		}
	}
	p.mu.Unlock()
	for _, name := range stop {
		if _, err := p.StopScrub(name); err != nil {
			klog.ErrorS(err, "Pausing the scheduled scrub", "volume", name)
		}
	}
	for i, name := range append(fresh, start...) {
		if _, err := p.startScrub(name, kinds[name], true, i < len(fresh)); err != nil {
			klog.InfoS("Scheduled scrub not started", "volume", name, "err", err)
		}
	}
}

// lastCompleted is when volume u's last scrub reached the end, in Unix nanoseconds (0:
// never): the later of this process's record and the one RecordScrubCompleted restored.
// Caller holds p.mu.
func (p *Pool) lastCompleted(u UUID, r *scrubRun) int64 {
	var t int64
	if at, ok := p.restored[u]; ok {
		t = at.UnixNano()
	}
	if r != nil && r.info.LastCompleted != nil {
		t = max(t, r.info.LastCompleted.UnixNano())
	}
	return t
}

// RecordScrubCompleted tells the schedule when volume name's last scrub reached the end
// before this process opened the pool (the node agent keeps it in the Raid10Volume's
// status.scrub), so that a restart does not repeat the cycle's check. The pool keeps no
// such record on disk. An unknown volume is ErrNotFound.
func (p *Pool) RecordScrubCompleted(name string, at time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.volumeNamed(name)
	if err != nil {
		return err
	}
	if old, ok := p.restored[v.uuid]; !ok || at.After(old) {
		p.restored[v.uuid] = at
	}
	return nil
}
