package plugin

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
)

// Holder is --mode=holder: it keeps the devices a stopping node plugin gives it until the
// next one takes them. It runs beside the node plugin and is updated separately, so a
// rolling update of the plugin (old pod deleted before the new one starts) keeps every
// device served.
type Holder struct {
	// StateDir is the node plugin's --state-dir; the holder listens on
	// kernel.HolderSocket in its handover directory.
	StateDir string
	// Wait is how long a holder told to stop keeps the devices it holds for the next
	// plugin (--handover-wait).
	Wait time.Duration
}

// Run holds devices until ctx ends and either nothing is held or Wait passed; the devices
// it still holds are then closed: the kernel sees their connections end, as after a
// crash, and the next plugin reattaches them.
func (h *Holder) Run(ctx context.Context) error {
	if err := os.MkdirAll(h.StateDir, 0o700); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	path, err := holderPath(h.StateDir)
	if err != nil {
		return err
	}
	l, err := kernel.ListenHolder(path)
	if err != nil {
		return err
	}
	klog.InfoS("Holding NBD devices between node plugins", "socket", path)
	errc := make(chan error, 1)
	go func() { errc <- l.Serve() }()
	select {
	case <-ctx.Done():
		// Told to stop while holding (the holder rolls with the plugin): the next plugin
		// may still come for them within Wait.
		for deadline := time.Now().Add(h.Wait); l.Held() > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if n := l.Held(); n > 0 {
			klog.InfoS("Stopping with devices held: they wait for a reattach", "devices", n)
		}
		_ = l.Close()
		return <-errc
	case err := <-errc:
		_ = l.Close()
		return err
	}
}
