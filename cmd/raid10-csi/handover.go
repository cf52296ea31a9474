package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
)

// DefaultHandoverWait is the default of --handover-wait.
const DefaultHandoverWait = 10 * time.Second

// handoverTimeout bounds one handover on each side: the drain of the requests in flight
// (a member that hangs is failed by the engine after its member timeout), closing the arrays
// and passing the sockets.
const handoverTimeout = 30 * time.Second

// handover is the predecessor's side of a planned restart: a node plugin listens on
// kernel.HandoverSocket in --state-dir from the moment it serves, and when a successor
// connects (a new pod started beside it, or a process started after SIGTERM, within
// --handover-wait) it hands every device over: stop at a request boundary, close the arrays,
// pass the sockets. Afterwards it serves nothing (retired) and ends with its context.
type handover struct {
	ln *kernel.HandoverListener
	np *nodePlugin

	done    chan struct{} // serve returned
	retired chan struct{} // a successor came (closed before the handover begins)
	mu      sync.Mutex
	err     error // of the handover
}

// handoverPath is the handover socket, in a private directory of its own under --state-dir
// (which may be a host directory of any mode).
func handoverPath(stateDir string) (string, error) {
	dir := filepath.Join(stateDir, "handover")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", err
	}
	return filepath.Join(dir, kernel.HandoverSocket), nil
}

func listenHandover(stateDir string, np *nodePlugin) (*handover, error) {
	path, err := handoverPath(stateDir)
	if err != nil {
		return nil, err
	}
	ln, err := kernel.ListenHandover(path)
	if err != nil {
		return nil, err
	}
	return &handover{ln: ln, np: np, done: make(chan struct{}), retired: make(chan struct{})}, nil
}

// serve waits for one successor and hands over to it; cancel stops the plugin's other tasks.
func (h *handover) serve(cancel context.CancelFunc) {
	defer close(h.done)
	req, err := h.ln.Accept()
	if err != nil {
		if !errors.Is(err, net.ErrClosed) {
			klog.ErrorS(err, "Handover socket")
		}
		return
	}
	close(h.retired)
	cancel()
	_ = h.ln.Close()
	start := time.Now()
	ctx, stop := context.WithTimeout(context.Background(), handoverTimeout)
	defer stop()
	devs, err := h.np.attacher.HandOver(ctx)
	if err != nil {
		req.Refuse()
		h.fail(fmt.Errorf("hand over the NBD devices: %w", err))
		return
	}
	drained := time.Since(start)
	if err := h.np.pool.Close(); err != nil {
		klog.ErrorS(err, "Closing the pool for the successor")
	}
	closed := time.Since(start)
	err = req.Send(ctx, devs)
	for i := range devs {
		devs[i].Close() // the successor holds its own duplicates
	}
	if err != nil {
		h.fail(fmt.Errorf("pass the NBD devices to the successor: %w", err))
		return
	}
	klog.InfoS("Handed the NBD devices to the successor", "devices", len(devs),
		"drained", drained, "poolClosed", closed, "total", time.Since(start))
}

func (h *handover) fail(err error) {
	klog.ErrorS(err, "Handover failed: the devices are left to a reattach")
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

// stop waits up to wait for a successor (0: none), then stops listening and waits for a
// handover in progress. It reports whether the devices went (or were meant to go) to a
// successor, and the handover's error.
func (h *handover) stop(wait time.Duration) (bool, error) {
	if wait > 0 {
		select {
		case <-h.retired:
		case <-time.After(wait):
		}
	}
	_ = h.ln.Close()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.retired:
		return true, h.err
	default:
		return false, nil
	}
}

// takeHandover asks a predecessor serving --state-dir for its devices (none when nobody
// listens: a first start, or a restart after a crash).
func takeHandover(ctx context.Context, stateDir string) ([]kernel.Handed, error) {
	ctx, cancel := context.WithTimeout(ctx, handoverTimeout)
	defer cancel()
	start := time.Now()
	path, err := handoverPath(stateDir)
	if err != nil {
		return nil, err
	}
	devs, err := kernel.TakeHandover(ctx, path)
	if err != nil {
		return nil, err
	}
	if devs != nil {
		klog.InfoS("Took the NBD devices over from the predecessor", "devices", len(devs), "took", time.Since(start))
	}
	return devs, nil
}
