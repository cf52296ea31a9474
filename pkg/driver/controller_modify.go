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
// limits, params_limits.go, and the background rates, params_rates.go) to the volume: it
// merges them into the Raid10Volume's spec.limits and spec.rates, keys not named keeping
// their values, and returns once the spec is written. The node agent puts them on the array
// at once when it is assembled, else when it is (status.limits and status.rates show what
// it applied). A modify that changes nothing writes nothing.
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

// modifyLimits is one read-merge-write of the volume's spec.limits and spec.rates.
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
	if equality.Semantic.DeepEqual(limits, vol.Spec.Limits) && equality.Semantic.DeepEqual(rates, vol.Spec.Rates) {
		return nil
	}
	vol.Spec.Limits, vol.Spec.Rates = limits, rates
	if err := c.store.UpdateVolume(ctx, vol); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Volume limits changed", "volumeID", id, "limits", limits, "rates", rates)
	return nil
}
