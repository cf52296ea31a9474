package pool

import (
	"fmt"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// SetVolumeLimits puts the QoS limits l (raid10.Limits: requests and bytes per second,
// each with a burst, 0 unlimited) on the volume called name, at once if its array is
// assembled (requests waiting under the old limits reserve again under l), else when it
// is. The pool keeps l in memory and applies it again whenever this process assembles the
// volume anew (a disk returned, a copy resumed); it does not persist it: after a restart
// the volume has no limits until the caller sets them again (the node agent applies them
// from the volume's custom resource). Errors: ErrInvalidArgument naming the negative
// field (it also matches raid10.ErrInvalid), ErrNotFound, ErrClosed.
func (p *Pool) SetVolumeLimits(name string, l raid10.Limits) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("%w: volume %q: %w", ErrInvalidArgument, name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.openVolumeLocked(name)
	if err != nil {
		return err
	}
	v.limits = l
	if v.arr == nil {
		return nil
	}
	return v.arr.SetLimits(l)
}

// applyLimits gives a newly assembled array of v the limits set on v. Caller holds p.mu.
func (p *Pool) applyLimits(v *volume) {
	if v.limits == (raid10.Limits{}) {
		return
	}
	if err := v.arr.SetLimits(v.limits); err != nil { // validated when set: never
		klog.ErrorS(err, "Volume limits not applied", "volume", v.name)
	}
}
