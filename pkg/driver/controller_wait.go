package driver

// The controller's waits for the node agent: every CSI call that changes a Raid10Volume
// waits until the agent on its node reports the change (or a failure), bounded by the ready
// timeout. Over a store that can watch (VolumeWatcher: the API server) a wait watches the
// volume and costs no request while nothing changes (volumeWait); elsewhere, and whenever
// the watch cannot be had, it reads the volume every pollInterval.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// waitReady waits until the node agent reports volume id Ready for its current generation
// with at least size bytes. It gives up after readyTimeout (or the request's deadline) with an
// error wrapping ErrNotReady; a retry resumes. A volume the agent reports Failed is reported
// as ErrInsufficientCapacity or ErrVolumeFailed; with clearFailed, and only when the agent has
// never provisioned it (no status.capacity, so it holds no data), it is also deleted so that a
// retry, possibly on another node, starts afresh.
func (c *ControllerServer) waitReady(ctx context.Context, id string, size int64, clearFailed bool) (*v1alpha1.Raid10Volume, error) {
	return c.waitVolume(ctx, id, size, "", func(vol *v1alpha1.Raid10Volume) error {
		st := vol.Status
		if st.Phase != v1alpha1.VolumePhaseFailed {
			return nil
		}
		cause := ErrVolumeFailed
		if cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); cond != nil && cond.Reason == v1alpha1.ReasonInsufficientCapacity {
			cause = ErrInsufficientCapacity
		}
		if clearFailed && vol.Status.Capacity == nil {
			if err := c.store.DeleteVolume(ctx, id); err != nil {
				return err
			}
		}
		return fmt.Errorf("volume %q on node %q: node agent reports Failed: %s: %w", id, vol.Spec.Node, st.Message, cause)
	})
}

// waitVolume polls volume id until the node agent reports it Ready for its current generation
// with at least size bytes. For any other phase of the current generation, other decides: an
// error ends the wait, nil waits on. Running out of time is an error wrapping ErrNotReady that
// names the last phase seen and what (the operation waited for, "" for the volume itself).
func (c *ControllerServer) waitVolume(ctx context.Context, id string, size int64, what string,
	other func(*v1alpha1.Raid10Volume) error) (*v1alpha1.Raid10Volume, error) {
	var last *v1alpha1.Raid10Volume
	err := c.wait(ctx, id, func(vol *v1alpha1.Raid10Volume) (bool, error) {
		if vol == nil {
			return false, fmt.Errorf("raid10volume %q: %w", id, ErrNotFound)
		}
		last = vol
		st := vol.Status
		if st.ObservedGeneration < vol.Generation {
			return false, nil
		}
		if st.Phase == v1alpha1.VolumePhaseReady {
			return st.Capacity == nil || st.Capacity.Value() >= size, nil
		}
		return false, other(vol)
	})
	if errors.Is(err, ErrNotReady) && last != nil {
		return nil, fmt.Errorf("volume %q on node %q (phase %q): %s%w", id, last.Spec.Node, last.Status.Phase, what, err)
	}
	return last, err
}

// waitGone waits until volume id no longer exists (its finalizer removed by the agent).
func (c *ControllerServer) waitGone(ctx context.Context, id string) error {
	return c.wait(ctx, id, func(vol *v1alpha1.Raid10Volume) (bool, error) { return vol == nil, nil })
}

// poll (snapshots' waits) calls done every pollInterval until it returns true or an error, for at most
// readyTimeout. Running out of time is an error wrapping ErrNotReady, not the context's
// deadline error, so that the caller learns the operation is still under way.
func (c *ControllerServer) poll(ctx context.Context, done func() (bool, error)) error {
	wctx, cancel := context.WithTimeout(ctx, c.readyTimeout)
	defer cancel()
	t := time.NewTicker(c.pollInterval)
	defer t.Stop()
	for {
		ok, err := done()
		if ok || err != nil {
			if err != nil && wctx.Err() != nil && ctx.Err() == nil {
				// our own timeout cut a store call short
				return fmt.Errorf("node agent has not finished within %s: %w", c.readyTimeout, ErrNotReady)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node agent has not finished before the request's deadline: %w", ErrNotReady)
		case <-wctx.Done():
			return fmt.Errorf("node agent has not finished within %s: %w", c.readyTimeout, ErrNotReady)
		case <-t.C:
		}
	}
}

// waitExpanded waits as waitReady does until the agent reports the volume Ready with at least
// size bytes, except that an Expanding phase for the current generation ends the wait at once:
// the pool refused the growth for now, and the caller is told why (ErrOperationInFlight,
// Aborted: retry later) instead of timing out.
func (c *ControllerServer) waitExpanded(ctx context.Context, id string, size int64) (*v1alpha1.Raid10Volume, error) {
	return c.waitVolume(ctx, id, size, fmt.Sprintf("expansion to %d bytes: ", size), func(vol *v1alpha1.Raid10Volume) error {
		st := vol.Status
		switch st.Phase {
		case v1alpha1.VolumePhaseExpanding:
			return fmt.Errorf("volume %q on node %q: expansion to %d bytes is pending on the node agent, which retries it (status Expanding: %s): %w",
				id, vol.Spec.Node, size, st.Message, ErrOperationInFlight)
		case v1alpha1.VolumePhaseFailed:
			return fmt.Errorf("volume %q on node %q: node agent reports Failed: %s: %w", id, vol.Spec.Node, st.Message, ErrVolumeFailed)
		}
		return nil
	})
}
