package attach

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/ublk"
)

// PoolAttacher is the data path of a node: it serves a volume's array from the local
// pool with an nbd.Server of its own (one export, "") and hands it to the kernel through a
// kernel.Attacher, which records the device in the shared state file so that a restarted
// plugin reattaches it with NBD_CMD_RECONFIGURE (Reattach).
type PoolAttacher struct {
	pool  *pool.Pool
	nl    *kernel.Netlink
	state *kernel.State
	opts  kernel.Options

	ownNL bool // Close closes nl (OpenPoolAttacher)

	mu       sync.Mutex // guards vols, retired, frontend, ublkRec and ublkFeat
	vols     map[string]*served
	retired  bool         // the devices were handed to a successor (node_handover.go)
	frontend Frontend     // a volume's frontend when it names none (EnableUblk); "": NBD
	ublkRec  *ublkRecords // the ublk devices (node_ublk.go); nil: ublk not enabled
	ublkFeat ublk.Flags   // the kernel's ublk features, asked once by EnableUblk
}

// served is one attached volume: over NBD (srv, att, dev) or over ublk (ub).
type served struct {
	srv *nbd.Server
	att *kernel.Attacher
	dev *kernel.Device
	ub  *ublk.Device
}

// path is the volume's block device.
func (s *served) path() string {
	if s.ub != nil {
		return s.ub.Path()
	}
	return s.dev.Path()
}

// OpenPoolAttacher is the start-up of a node plugin's data path: it connects to the kernel's
// nbd netlink family (in the network namespace of opts.NetNS when set), loads the device state file at statePath (its directory must exist),
// marks the process an I/O flusher (a failure, for want of CAP_SYS_RESOURCE, is only logged),
// adopts the devices a predecessor handed over (kernel.TakeHandover), reclaims the devices a
// crashed predecessor leaked (kernel.Reclaim) and reattaches every device recorded. A device
// that cannot be adopted or reattached is logged and left for its NodeStageVolume retry;
// Close also closes the netlink connection.
func OpenPoolAttacher(ctx context.Context, p *pool.Pool, statePath string, opts kernel.Options, handed ...kernel.Handed) (*PoolAttacher, error) {
	state, err := kernel.OpenState(statePath)
	if err != nil {
		return nil, err
	}
	nl, err := kernel.DialNetNS(opts.NetNS)
	if err != nil {
		return nil, fmt.Errorf("nbd netlink: %w", err)
	}
	if err := kernel.SetIOFlusher(); err != nil {
		klog.ErrorS(err, "Not an I/O flusher: memory reclaim may wait on our own devices")
	}
	a := NewPoolAttacher(p, nl, state, opts)
	a.ownNL = true
	a.Adopt(handed)
	if vols, err := kernel.Reclaim(nl, state); err != nil {
		klog.ErrorS(err, "Reclaiming leaked NBD devices", "reclaimed", vols)
	}
	_ = a.Reattach(ctx) // each failure is logged
	return a, nil
}

// NewPoolAttacher returns an attacher over p. nl and state are shared by every volume; the
// caller closes them after Close.
func NewPoolAttacher(p *pool.Pool, nl *kernel.Netlink, state *kernel.State, opts kernel.Options) *PoolAttacher {
	return &PoolAttacher{pool: p, nl: nl, state: state, opts: opts, vols: map[string]*served{}}
}

// Attach serves the volume on a device of the node's frontend (AttachFrontend).
func (a *PoolAttacher) Attach(ctx context.Context, volumeID string) (string, error) {
	return a.AttachFrontend(ctx, volumeID, FrontendAuto)
}

// AttachFrontend serves the volume on a block device and returns its path: /dev/nbdX, or
// /dev/ublkbN for FrontendUblk (FrontendAuto: the node's --frontend, EnableUblk). An attached
// volume returns its device, whichever frontend serves it; a device recorded by an earlier
// process is reattached (NBD) or recovered (ublk).
func (a *PoolAttacher) AttachFrontend(ctx context.Context, volumeID string, f Frontend) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.vols[volumeID]; s != nil {
		return s.path(), nil
	}
	if a.retired {
		return "", ErrRetired
	}
	if f == FrontendAuto || f == "" {
		f = a.frontend
	}
	if f == FrontendUblk {
		s, err := a.attachUblk(ctx, volumeID)
		if err != nil {
			return "", err
		}
		a.vols[volumeID] = s
		return s.path(), nil
	}
	arr, err := a.pool.Array(volumeID)
	if err != nil {
		return "", err
	}
	srv, err := nbd.NewVolumeServer(volumeID, arr)
	if err != nil {
		return "", err
	}
	att := kernel.NewAttacher(srv, a.nl, a.state, a.opts)
	dev, err := att.Attach(volumeID, "")
	if err != nil {
		_ = srv.Close()
		return "", err
	}
	a.vols[volumeID] = &served{srv: srv, att: att, dev: dev}
	return dev.Path(), nil
}

// Detach disconnects the volume's device and stops its server. A volume not attached is no
// error (a device recorded by an earlier process is still disconnected).
func (a *PoolAttacher) Detach(ctx context.Context, volumeID string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.vols[volumeID]
	if a.retired {
		return ErrRetired
	}
	if a.ublkRec != nil && (s == nil || s.ub != nil) {
		if err := a.detachUblk(ctx, volumeID, s); err != nil {
			return err
		}
		if s != nil {
			delete(a.vols, volumeID)
			return nil
		}
	}
	if s == nil {
		// Not ours in this process: a recorded device of an earlier one is disconnected.
		return kernel.NewAttacher(nil, a.nl, a.state, a.opts).Detach(volumeID)
	}
	if err := s.att.Detach(volumeID); err != nil {
		return err
	}
	delete(a.vols, volumeID)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(sctx)
	return nil
}

// Volume reports the volume's size and condition (volumeState).
func (a *PoolAttacher) Volume(_ context.Context, volumeID string) (VolumeState, error) {
	vi, err := a.pool.Volume(volumeID)
	if err != nil {
		return VolumeState{}, err
	}
	return volumeState(vi), nil
}

// Expand resizes the volume's attached device to the array's current size (the pool grew
// the array; the export's size follows it) and returns the device's size in bytes. A volume
// not attached by this process is ErrNotAttached: it must be staged first.
func (a *PoolAttacher) Expand(ctx context.Context, volumeID string) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.vols[volumeID]
	if s == nil {
		return 0, fmt.Errorf("volume %q is not attached on this node (not staged): %w", volumeID, ErrNotAttached)
	}
	if s.ub != nil {
		return a.expandUblk(ctx, volumeID, s.ub)
	}
	return s.att.Resize(volumeID)
}

// Device returns the device path the volume is attached on by this process, "" when it is
// not attached. The node agent reports it as the Raid10Volume's status.devicePath: the agent
// alone writes the status, the attacher only answers.
func (a *PoolAttacher) Device(volumeID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.vols[volumeID]; s != nil {
		return s.path()
	}
	return ""
}

// Reattached reports whether the volume's NBD device was taken over configured (reattached
// with NBD_CMD_RECONFIGURE, or adopted from a predecessor) rather than connected anew: after
// a restart the kernel's queued requests survive only then.
func (a *PoolAttacher) Reattached(volumeID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.vols[volumeID]
	return s != nil && s.dev != nil && s.dev.Reattached
}

// Reattach attaches again every volume recorded in the state file (after a restart of the
// plugin): the kernel's queued requests then run on fresh connections. A volume that fails
// is logged and skipped; the first error is returned.
func (a *PoolAttacher) Reattach(ctx context.Context) error {
	var first error
	for _, id := range a.state.Volumes() {
		if _, err := a.Attach(ctx, id); err != nil {
			klog.ErrorS(err, "Reattaching volume", "volumeID", id)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// Close stops serving every device without detaching it (a restarted plugin reattaches
// them), waiting up to ctx for requests in flight.
func (a *PoolAttacher) Close(ctx context.Context) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, s := range a.vols {
		delete(a.vols, id)
		if s.ub != nil {
			s.ub.Detach() // the kernel keeps its I/O queued for the next plugin (EnableUblk)
			continue
		}
		s.att.Close()
		_ = s.srv.Shutdown(ctx)
		s.att.Wait()
	}
	if a.ownNL {
		_ = a.nl.Close()
	}
}
