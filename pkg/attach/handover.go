package attach

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
)

// HandOver stops serving every attached volume for a successor process, which the kernel does
// not notice: each device's connections stop at a request boundary with every request read
// answered (kernel.Attacher.HandOver) and are returned, open, with the devices' records. From
// then on Attach and Detach fail; the caller closes the pool (the arrays) before it passes the
// devices on, so that the successor opens each array only after this process closed it. On
// an error every connection is closed: the devices stay attached and recorded and a successor
// reattaches them as after a crash.
func (a *PoolAttacher) HandOver(ctx context.Context) ([]kernel.Handed, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.retired = true
	var out []kernel.Handed
	var first error
	for id, s := range a.vols {
		if s.ub != nil {
			// Nothing to pass: the kernel keeps the device and its I/O queued for the
			// successor, which recovers it (EnableUblk).
			s.ub.Detach()
			delete(a.vols, id)
			continue
		}
		h, err := s.att.HandOver(ctx)
		_ = s.srv.Close()
		delete(a.vols, id)
		if err != nil {
			klog.ErrorS(err, "Handing over volume", "volumeID", id)
			if first == nil {
				first = err
			}
			continue
		}
		out = append(out, h...)
	}
	if first != nil {
		for i := range out {
			out[i].Close()
		}
		return nil, first
	}
	return out, nil
}

// Adopt serves the devices a predecessor handed over, each from its volume's array in the
// pool. A device that cannot be adopted is logged and its connections closed (the kernel then
// waits for a reattach, which Reattach or the volume's NodeStageVolume retry does).
func (a *PoolAttacher) Adopt(handed []kernel.Handed) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range handed {
		if err := a.adopt(h); err != nil {
			klog.ErrorS(err, "Adopting a handed-over NBD device", "volumeID", h.VolumeID, "device", kernel.DevicePath(h.Record.Index))
		}
	}
}

func (a *PoolAttacher) adopt(h kernel.Handed) error {
	if a.vols[h.VolumeID] != nil || a.retired {
		h.Close()
		return fmt.Errorf("attach: volume %q is served here already", h.VolumeID)
	}
	arr, err := a.pool.Array(h.VolumeID)
	if err != nil {
		h.Close()
		return err
	}
	srv, err := nbd.NewVolumeServer(h.VolumeID, arr)
	if err != nil {
		h.Close()
		return err
	}
	att := kernel.NewAttacher(srv, a.nl, a.state, a.opts)
	dev, err := att.Adopt(h, "")
	if err != nil {
		_ = srv.Close()
		return err
	}
	a.vols[h.VolumeID] = &served{srv: srv, att: att, dev: dev}
	return nil
}
