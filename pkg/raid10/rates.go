package raid10

import (
	"sync"
	"sync/atomic"
	"time"
)

// Rates are the speeds of an array's background work in bytes per second,
// as md's sync_speed_min and sync_speed_max, changeable while the array
// runs (SetRates). Assemble and Create start an array with
// Options.SyncRateMin and SyncRateMax and no separate scrub ceiling.
type Rates struct {
	// SyncMin is the rate a resync, recovery, scrub or copy into the array
	// keeps even under foreground I/O. 0 means DefaultSyncRateMin.
	SyncMin int64
	// SyncMax is the ceiling of a resync, a recovery and a copy into the
	// array, and of a scrub when ScrubMax is 0. 0 means
	// DefaultSyncRateMax; a negative value means unlimited.
	SyncMax int64
	// ScrubMax is the ceiling of a scrub (Check, Repair). 0 means SyncMax;
	// a negative value means unlimited.
	ScrubMax int64
}

// rateState holds the array's Rates in force. The throttle and the copier
// load them once per chunk, so a change applies to the running work at its
// next chunk; the request path never reads them.
type rateState struct {
	setMu sync.Mutex            // one SetRates at a time
	cur   atomic.Pointer[Rates] // nil: Options' rates
	gen   atomic.Uint64         // changes made; the copier restarts its rate window on a new one
}

// Validate reports a negative SyncMin (a floor cannot be unlimited).
func (r Rates) Validate() error {
	if r.SyncMin < 0 {
		return invalidf("rate SyncMin is negative (%d)", r.SyncMin)
	}
	return nil
}

// normalized is r with the defaults in force.
func (r Rates) normalized() Rates {
	if r.SyncMin == 0 {
		r.SyncMin = DefaultSyncRateMin
	}
	if r.SyncMax == 0 {
		r.SyncMax = DefaultSyncRateMax
	}
	return r
}

// SetRates changes the array's background rates at once: a running resync,
// recovery, scrub or copy into the array follows them from its next chunk
// (a throttle asleep for the old ceiling wakes within 200 ms). The rate
// Status().Sync reports, and the one the ceilings are measured against, is
// counted again from the change, so that the work goes on at the new rate
// rather than making up for the old one. ErrInvalid for a negative SyncMin.
func (a *Array) SetRates(r Rates) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.normalized()
	a.rates.setMu.Lock()
	defer a.rates.setMu.Unlock()
	if r == a.Rates() {
		return nil
	}
	a.rates.cur.Store(&r)
	a.rates.gen.Add(1)
	a.progMu.Lock()
	if a.prog.Running {
		a.progBase, a.syncStart = a.prog.Done, time.Now()
	}
	a.progMu.Unlock()
	return nil
}

// Rates returns the rates in force, defaults filled in.
func (a *Array) Rates() Rates {
	if r := a.rates.cur.Load(); r != nil {
		return *r
	}
	return Rates{SyncMin: a.opts.SyncRateMin, SyncMax: a.opts.SyncRateMax}
}

// syncCeiling is the ceiling (<= 0: none) and the floor of the running
// sync: ScrubMax for a scrub that has one, else SyncMax.
func (a *Array) syncCeiling() (ceiling, floor int64) {
	r := a.Rates()
	a.progMu.Lock()
	kind := a.prog.Kind
	a.progMu.Unlock()
	if (kind == SyncCheck || kind == SyncRepair) && r.ScrubMax != 0 {
		return r.ScrubMax, r.SyncMin
	}
	return r.SyncMax, r.SyncMin
}
