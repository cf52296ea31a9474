package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/klog/v2"
)

// modifyAttempts bounds the read-merge-write rounds of one ControllerModifyVolume that lose
// to another writer of the object (the node agent adds its finalizer; a status write moves
// the resourceVersion too); past them the call answers Aborted and the resizer retries.
const modifyAttempts = 3

// ControllerModifyVolume applies a VolumeAttributesClass's mutable parameters (the QoS
// limits, params_limits.go, the background rates, params_rates.go, and the scrub schedule,
// params_scrub.go) to the volume: it merges them into the Raid10Volume's spec.limits,
// spec.rates and spec.scrubSchedule, keys not named keeping their values, and returns once
// the spec is written. The node agent puts them on the array (the schedule on the pool) at
// once when it is assembled, else when it is (status.limits, status.rates and
// status.scrubSchedule show what it applied). A modify that changes nothing writes nothing.
func (c *ControllerServer) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, fmt.Errorf("volume_id: must not be empty: %w", ErrInvalidArgument)
	}
	// Validate every key before looking at the volume: a bad class fails the same way for
	// every volume.
	if _, err := parseMutableParams(req.GetMutableParameters(), nil); err != nil {
		return nil, err
	}
	if err := c.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer c.locks.Release(id)

	for attempt := 1; ; attempt++ {
		err := c.modifyLimits(ctx, id, req.GetMutableParameters())
		if !errors.Is(err, ErrConflict) || attempt == modifyAttempts {
			if err != nil {
				return nil, err
			}
			return &csi.ControllerModifyVolumeResponse{}, nil
		}
	}
}

// modifyLimits is one read-merge-write of the volume's spec.limits, spec.rates and
// spec.scrubSchedule.
func (c *ControllerServer) modifyLimits(ctx context.Context, id string, params map[string]string) error {
	vol, err := c.store.GetVolume(ctx, id)
	if err != nil {
		return err
	}
	if vol.DeletionTimestamp != nil {
		return fmt.Errorf("volume %q is being deleted: %w", id, ErrFailedPrecondition)
	}
	limits, err := parseMutableParams(params, vol.Spec.Limits)
	if err != nil {
		return err
	}
	rates, err := parseMutableRates(params, vol.Spec.Rates)
	if err != nil {
		return err
	}
	scrub, err := parseMutableScrub(params, vol.Spec.ScrubSchedule)
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(limits, vol.Spec.Limits) && equality.Semantic.DeepEqual(rates, vol.Spec.Rates) &&
		equality.Semantic.DeepEqual(scrub, vol.Spec.ScrubSchedule) {
		return nil
	}
	vol.Spec.Limits, vol.Spec.Rates, vol.Spec.ScrubSchedule = limits, rates, scrub
	if err := c.store.UpdateVolume(ctx, vol); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Volume limits changed", "volumeID", id, "limits", limits, "rates", rates, "scrubSchedule", scrub)
	return nil
}
