package pool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// A scrub reads both copies of every chunk of a volume and compares them (check), or also
// rewrites the second copy of a block whose copies differ from the first (repair), as md's
// sync_action does. Reads that fail and blocks recorded bad are healed from the other copy
// either way. It runs in the background at the engine's sync rate (the same floor and ceiling
// as a rebuild, backing off to the floor while the volume serves I/O); its progress shows in
// VolumeInfo.Sync (kind "check" or "repair") and its outcome in VolumeInfo.Scrub.

// ScrubKind is what a scrub does.
type ScrubKind string

// Scrub kinds.
const (
	// ScrubCheck compares the copies and counts the blocks that differ.
	ScrubCheck ScrubKind = "check"
	// ScrubRepair also rewrites the second copy of each differing block from the first.
	ScrubRepair ScrubKind = "repair"
)

// ScrubState is where a volume's last scrub is.
type ScrubState string

// Scrub states.
const (
	ScrubRunning ScrubState = "Running"
	// ScrubPaused: stopped before the end (its window closed, or StopScrub); the next start
	// of the same kind continues from Resume where the engine can (see ScrubInfo.Resume).
	ScrubPaused ScrubState = "Paused"
	ScrubDone   ScrubState = "Done"
	// ScrubFailed: the scrub stopped on an error (the array closed, a member failed).
	ScrubFailed ScrubState = "Failed"
)

// ScrubInfo is a volume's current or last scrub.
type ScrubInfo struct {
	State ScrubState `json:"state"`
	Kind  ScrubKind  `json:"kind"`
	// Scheduled is true for a scrub the pool's schedule started (Config.Scrub).
	Scheduled bool      `json:"scheduled,omitempty"`
	Started   time.Time `json:"started"`
	// Finished is when it ended, was paused or failed; nil while running.
	Finished *time.Time `json:"finished,omitempty"`
	// From is the array offset this pass started at (0, or where a paused one stopped).
	From int64 `json:"from,omitempty"`
	// Done of Total array bytes are visited; Rate and ETA while it runs.
	Done    int64         `json:"done"`
	Total   int64         `json:"total"`
	Percent float64       `json:"percent"`
	Rate    float64       `json:"rateBytesPerSecond,omitempty"`
	ETA     time.Duration `json:"eta,omitempty"`
	// Mismatches counts the blocks (raid10.BlockSize) whose copies differed in this pass,
	// Repaired those rewritten, Lost those found with no readable copy.
	Mismatches int64 `json:"mismatches"`
	Repaired   int64 `json:"repaired,omitempty"`
	Lost       int64 `json:"lost,omitempty"`
	// MismatchesTotal counts the mismatches of every scrub of this volume since the pool
	// opened (the metric raid10_volume_scrub_mismatches_total).
	MismatchesTotal int64 `json:"mismatchesTotal"`
	// Resume is where a Paused scrub continues: a later start of the same kind carries on
	// from there (the engine's CheckRange, RepairRange), with this pass's counts.
	Resume int64 `json:"resume,omitempty"`
	// LastCompleted is when a pass last reached the end.
	LastCompleted *time.Time `json:"lastCompleted,omitempty"`
	Error         string     `json:"error,omitempty"`
}

// EventScrubFinished: a scrub reached the end of a volume (Message: what it found); sent
// with EventKind EventScrubMismatches instead when it found differing copies.
const (
	EventScrubFinished   EventKind = "ScrubFinished"
	EventScrubMismatches EventKind = "ScrubMismatches"
)

// scrubRun is a volume's scrub state. Guarded by Pool.mu.
type scrubRun struct {
	info   ScrubInfo
	cancel context.CancelFunc // nil unless running
	done   chan struct{}      // closed when the running pass ends
}

// scrubPollInterval is how often a running scrub's progress is copied from the engine.
const scrubPollInterval = 500 * time.Millisecond

// StartScrub starts a scrub of volume name in the background and returns its state. A
// scrub of the same kind already running is success (its state is returned); a Paused one
// of the same kind continues from where it stopped. The volume must
// have every member in sync (ErrFailedPrecondition otherwise: a rebuild comes first, and a
// missing copy cannot be compared); a scrub of the other kind running is
// ErrFailedPrecondition too.
func (p *Pool) StartScrub(name string, kind ScrubKind) (ScrubInfo, error) {
	return p.startScrub(name, kind, false, false)
}

// startScrub starts a pass; fresh starts it from the beginning even where a paused one of
// the same kind could continue (a new cycle of the schedule).
func (p *Pool) startScrub(name string, kind ScrubKind, scheduled, fresh bool) (ScrubInfo, error) {
	if kind != ScrubCheck && kind != ScrubRepair {
		return ScrubInfo{}, fmt.Errorf("%w: scrub kind %q: must be %s or %s", ErrInvalidArgument, kind, ScrubCheck, ScrubRepair)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.openVolumeLocked(name)
	if err != nil {
		return ScrubInfo{}, err
	}
	if v.arr == nil {
		return ScrubInfo{}, fmt.Errorf("%w: volume %q is not assembled: %w", ErrFailedPrecondition, name, v.err)
	}
	st := v.arr.Status()
	for _, m := range st.Members {
		if m.State != raid10.MemberInSync {
			h, _ := healthOf(st)
			return ScrubInfo{}, fmt.Errorf("%w: volume %q is %s: a scrub needs every member in sync (member %d is %s)",
				ErrFailedPrecondition, name, h, m.Slot, m.State)
		}
	}
	r := p.scrubs[v.uuid]
	if r == nil {
		r = &scrubRun{}
		p.scrubs[v.uuid] = r
	}
	if r.cancel != nil {
		if r.info.Kind == kind {
			return r.info, nil
		}
		return ScrubInfo{}, fmt.Errorf("%w: volume %q: a %s is running", ErrFailedPrecondition, name, r.info.Kind)
	}
	from := int64(0)
	prev := r.info
	if !fresh && prev.State == ScrubPaused && prev.Kind == kind && prev.Resume > 0 && prev.Resume < st.Size {
		from = prev.Resume
	}
	info := ScrubInfo{State: ScrubRunning, Kind: kind, Scheduled: scheduled, Started: p.now(), From: from,
		Done: from, Total: st.Size, MismatchesTotal: prev.MismatchesTotal, LastCompleted: prev.LastCompleted}
	if from > 0 { // the same pass goes on: its counts so far stay
		info.Mismatches, info.Repaired, info.Lost = prev.Mismatches, prev.Repaired, prev.Lost
		info.Started = prev.Started
	}
	info.Percent = percent(info.Done, info.Total)
	ctx, cancel := context.WithCancel(context.Background())
	r.info, r.cancel, r.done = info, cancel, make(chan struct{})
	klog.InfoS("Scrub started", "volume", name, "kind", kind, "from", from, "scheduled", scheduled)
	go p.runScrub(ctx, v, r, r.done)
	return r.info, nil
}

// runScrub runs one pass and records its outcome.
func (p *Pool) runScrub(ctx context.Context, v *volume, r *scrubRun, done chan struct{}) {
	defer close(done)
	p.mu.Lock()
	arr := v.arr // the same object until the volume is deleted or the pool closes
	from, kind, counts := r.info.From, r.info.Kind, r.info
	p.mu.Unlock()
	if arr == nil {
		p.mu.Lock()
		r.cancel, r.info.State, r.info.Error = nil, ScrubFailed, "volume closed"
		p.mu.Unlock()
		return
	}

	stopPoll := make(chan struct{})
	polled := make(chan struct{})
	go func() { // copies the engine's progress into the state while the pass runs
		defer close(polled)
		t := time.NewTicker(scrubPollInterval)
		defer t.Stop()
		for {
			select {
			case <-stopPoll:
				return
			case <-t.C:
			}
			s := arr.Status().Sync
			if !s.Running || (s.Kind != raid10.SyncCheck && s.Kind != raid10.SyncRepair) {
				continue
			}
			p.mu.Lock()
			if r.cancel != nil {
				r.info.Done, r.info.Rate, r.info.ETA = s.Done, s.Rate, s.ETA
				r.info.Percent = percent(r.info.Done, r.info.Total)
				r.info.Mismatches = counts.Mismatches + s.Mismatches
			}
			p.mu.Unlock()
		}
	}()

	var res raid10.ScrubResult
	var err error
	// From an offset, as md's sync_min: a paused pass continues where it stopped. Progress
	// counts from the array's start.
	if kind == ScrubRepair {
		res, err = arr.RepairRange(ctx, from)
	} else {
		res, err = arr.CheckRange(ctx, from)
	}
	last := arr.Status().Sync // the engine keeps the last pass's Done until the next one
	close(stopPoll)
	<-polled

	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	in := &r.info
	in.Finished, in.Rate, in.ETA = &now, 0, 0
	in.Mismatches = counts.Mismatches + res.Mismatches
	in.Repaired = counts.Repaired + res.Repaired
	in.Lost = counts.Lost + res.Lost
	in.MismatchesTotal += res.Mismatches
	if last.Kind == raid10.SyncCheck || last.Kind == raid10.SyncRepair {
		in.Done = max(in.Done, last.Done)
	}
	r.cancel = nil
	switch {
	case err == nil:
		in.State, in.Done, in.Resume = ScrubDone, in.Total, 0
		in.LastCompleted = &now
		ev := Event{Kind: EventScrubFinished, Volume: v.name,
			Message: fmt.Sprintf("%s of %d bytes done: no mismatches", kind, in.Total)}
		if in.Mismatches > 0 {
			ev.Kind = EventScrubMismatches
			ev.Message = fmt.Sprintf("%s found %d blocks whose copies differ", kind, in.Mismatches)
			if kind == ScrubRepair {
				ev.Message += fmt.Sprintf(", %d rewritten from the first copy", in.Repaired)
			}
		}
		if in.Lost > 0 {
			ev.Message += fmt.Sprintf("; %d blocks with no readable copy (lost)", in.Lost)
		}
		p.emit(ev)
		klog.InfoS("Scrub done", "volume", v.name, "kind", kind, "mismatches", in.Mismatches, "repaired", in.Repaired, "lost", in.Lost)
	case errors.Is(err, context.Canceled):
		in.State, in.Resume = ScrubPaused, in.Done
		klog.InfoS("Scrub paused", "volume", v.name, "kind", kind, "done", in.Done, "resume", in.Resume)
	default:
		in.State, in.Error = ScrubFailed, err.Error()
		klog.ErrorS(err, "Scrub failed", "volume", v.name, "kind", kind)
	}
	in.Percent = percent(in.Done, in.Total)
}

func percent(done, total int64) float64 {
	if total <= 0 {
		return 0
	}
	return float64(done) * 100 / float64(total)
}

// StopScrub pauses volume name's running scrub (a later StartScrub of the same kind
// continues it where it stopped) and waits for it to stop. No scrub running is success.
func (p *Pool) StopScrub(name string) (ScrubInfo, error) {
	p.mu.Lock()
	v, err := p.volumeNamed(name)
	if err != nil {
		p.mu.Unlock()
		return ScrubInfo{}, err
	}
	r := p.scrubs[v.uuid]
	if r == nil {
		p.mu.Unlock()
		return ScrubInfo{}, nil
	}
	cancel, done := r.cancel, r.done
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return r.info, nil
}

// scrubInfo is v's scrub state, nil when it never had one. Caller holds p.mu.
func (p *Pool) scrubInfo(v *volume) *ScrubInfo {
	r := p.scrubs[v.uuid]
	if r == nil {
		return nil
	}
	in := r.info
	return &in
}

// stopScrubs cancels every running scrub and waits for them (Close). Caller does not hold
// p.mu.
func (p *Pool) stopScrubs() {
	p.mu.Lock()
	var waits []chan struct{}
	for _, r := range p.scrubs {
		if r.cancel != nil {
			r.cancel()
			waits = append(waits, r.done)
		}
	}
	p.mu.Unlock()
	for _, d := range waits {
		<-d
	}
}
