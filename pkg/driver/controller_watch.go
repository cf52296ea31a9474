package driver

// A wait for the node agent that watches the volume instead of reading it every
// pollInterval: at 16 CreateVolume calls in flight, the 250 ms reads alone were 64 requests a
// second on raid10volumes, all of them spent against the controller's client-side rate
// limit (issue 28).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// VolumeWatcher is a VolumeStore whose Raid10Volumes can be watched (KubeStore: a watch of
// the API server). The controller's waits use it to learn of the agent's status as it is
// written.
type VolumeWatcher interface {
	// WatchVolume watches the Raid10Volume named name until ctx ends or the watch is
	// stopped: its changes from the call on, perhaps its current state first, perhaps
	// other volumes' changes too (the caller filters by name).
	WatchVolume(ctx context.Context, name string) (watch.Interface, error)
}

// DefaultWaitResync is how often a wait that watches its volume still reads it, should the
// watch have missed a change (it never should): the bounded fallback of a watch that looks
// open but delivers nothing.
const DefaultWaitResync = 10 * time.Second

// wait calls check with volume id's state (nil once the volume is gone) whenever it may have
// changed, until check reports done or an error, for at most readyTimeout. Running out of
// time is an error wrapping ErrNotReady (see poll).
func (c *ControllerServer) wait(ctx context.Context, id string, check func(*v1alpha1.Raid10Volume) (bool, error)) error {
	wctx, cancel := context.WithTimeout(ctx, c.readyTimeout)
	defer cancel()
	w := &volumeWait{c: c, ctx: wctx, id: id, check: check}
	w.watcher, _ = c.store.(VolumeWatcher)
	defer w.stopWatch()
	err := w.run()
	if err != nil && wctx.Err() != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("node agent has not finished before the request's deadline: %w", ErrNotReady)
		}
		// our own timeout ended the wait, or cut a store call short
		return fmt.Errorf("node agent has not finished within %s: %w", c.readyTimeout, ErrNotReady)
	}
	return err
}

// volumeWait is one wait: a watch of the volume while one can be had, a read of the volume
// at the start, every resync while the watch runs, and every pollInterval while it does
// not (a store that cannot watch, a watch that failed to open: polled to the end; a watch
// that ended: opened again at the next tick).
type volumeWait struct {
	c       *ControllerServer
	ctx     context.Context // ends with the wait's time
	id      string
	check   func(*v1alpha1.Raid10Volume) (bool, error)
	watcher VolumeWatcher   // nil: poll
	w       watch.Interface // the open watch; nil while none
}

// run waits until check reports done or an error, or ctx ends (then ctx's error).
func (w *volumeWait) run() error {
	w.openWatch()
	done, err := w.read()
	t := time.NewTicker(w.interval())
	defer t.Stop()
	for !done && err == nil {
		var events <-chan watch.Event
		if w.w != nil {
			events = w.w.ResultChan()
		}
		select {
		case <-w.ctx.Done():
			return w.ctx.Err()
		case ev, ok := <-events:
			if !ok || ev.Type == watch.Error {
				// The API server ended the watch (its timeout, a compaction): read and watch
				// again at the next tick, so a watch that keeps failing costs no more than polling.
				klog.V(4).InfoS("Watch of the volume ended; watching again", "volume", w.id, "event", ev.Type)
				w.stopWatch()
				t.Reset(w.interval())
				continue
			}
			done, err = w.event(ev)
		case <-t.C:
			if w.w == nil {
				w.openWatch()
			}
			done, err = w.read()
			t.Reset(w.interval())
		}
	}
	return err
}

// interval is the time to the next read: the resync while a watch runs, else pollInterval.
func (w *volumeWait) interval() time.Duration {
	if w.w == nil {
		return w.c.pollInterval
	}
	if w.c.waitResync > 0 {
		return w.c.waitResync
	}
	return DefaultWaitResync
}

// openWatch starts watching the volume; a store that cannot watch it is polled for the rest
// of the wait.
func (w *volumeWait) openWatch() {
	if w.watcher == nil {
		return
	}
	wi, err := w.watcher.WatchVolume(w.ctx, w.id)
	if err != nil {
		klog.V(2).InfoS("Cannot watch the volume; reading it every poll interval", "volume", w.id, "interval", w.c.pollInterval, "err", err)
		w.watcher = nil
		return
	}
	w.w = wi
}

// stopWatch stops the open watch, if any.
func (w *volumeWait) stopWatch() {
	if w.w != nil {
		w.w.Stop()
		w.w = nil
	}
}

// read checks the volume as the store has it now.
func (w *volumeWait) read() (bool, error) {
	vol, err := w.c.store.GetVolume(w.ctx, w.id)
	if errors.Is(err, ErrNotFound) {
		return w.check(nil)
	}
	if err != nil {
		return false, err
	}
	return w.check(vol)
}

// event checks the volume a watch event carries; other volumes' events are ignored.
func (w *volumeWait) event(ev watch.Event) (bool, error) {
	vol, ok := ev.Object.(*v1alpha1.Raid10Volume)
	if !ok || vol.Name != w.id {
		return false, nil
	}
	switch ev.Type {
	case watch.Added, watch.Modified:
		return w.check(vol)
	case watch.Deleted:
		return w.check(nil)
	}
	return false, nil
}
