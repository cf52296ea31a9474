package pool

import (
	"fmt"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// SetVolumeRates sets the rates of the background work of the volume called name
// (raid10.Rates, bytes per second: the floor a rebuild, scrub or copy keeps under the
// volume's own I/O, the rebuild's ceiling, the scrub's ceiling). A field of 0 takes the
// node's value: the pool's RebuildRateMax for SyncMax (the engine's default when that is 0),
// the engine's defaults for SyncMin, SyncMax's for ScrubMax; so raid10.Rates{} returns the
// volume to the node's rates. They apply at once if the array is assembled (a running
// rebuild or scrub follows them from its next chunk), else when it is. Like
// SetVolumeLimits, the pool keeps them in memory only and applies them again whenever this
// process assembles the volume anew; after a restart the caller sets them again. Errors:
// ErrInvalidArgument naming a negative field, ErrNotFound, ErrClosed.
func (p *Pool) SetVolumeRates(name string, r raid10.Rates) error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"SyncMin", r.SyncMin}, {"SyncMax", r.SyncMax}, {"ScrubMax", r.ScrubMax}} {
		if f.v < 0 {
			return fmt.Errorf("%w: volume %q: rate %s is negative (%d)", ErrInvalidArgument, name, f.name, f.v)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.openVolumeLocked(name)
	if err != nil {
		return err
	}
	v.rates = r
	if v.arr == nil {
		return nil
	}
	return v.arr.SetRates(p.engineRates(r))
}

// engineRates is the volume's rates r over the node's: what the array is given.
func (p *Pool) engineRates(r raid10.Rates) raid10.Rates {
	if r.SyncMax == 0 {
		r.SyncMax = p.cfg.RebuildRateMax
	}
	return r
}

// applyRates gives a newly assembled array of v the rates set on v. Caller holds p.mu.
func (p *Pool) applyRates(v *volume) {
	if v.rates == (raid10.Rates{}) {
		return // the array was assembled with the node's
	}
	if err := v.arr.SetRates(p.engineRates(v.rates)); err != nil { // validated when set: never
		klog.ErrorS(err, "Volume rates not applied", "volume", v.name)
	}
}
