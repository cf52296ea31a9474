package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
)

// handoverTimeout bounds one handover on each side: the drain of the requests in flight
// (a member that hangs is failed by the engine after its member timeout), closing the arrays
// and passing the sockets.
const handoverTimeout = 30 * time.Second

// handover is the predecessor's side of a planned restart: a node plugin listens on
// kernel.HandoverSocket in --state-dir from the moment it serves. A successor that connects
// while this process serves (a surge update's new pod, or a process started by hand beside
// this one) is told to wait (kernel.HandoverRequest.Hold) and this process goes on serving;
// once this process is told to stop (letGo), or at once when it is stopping already, it
// hands every device over: stop at a request boundary, close the arrays, pass the sockets.
// Afterwards it serves nothing (retired) and ends with its context.
type handover struct {
	ln *kernel.HandoverListener
	np *nodePlugin

	done    chan struct{} // serve returned
	release chan struct{} // closed by letGo: a successor gets the devices from now on
	letOnce sync.Once
	waiting atomic.Bool   // a successor waits for the release
	retired chan struct{} // a successor takes the devices (closed before the handover begins)
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
	return &handover{ln: ln, np: np, done: make(chan struct{}), release: make(chan struct{}), retired: make(chan struct{})}, nil
}

// letGo releases the devices: a successor waiting now, or connecting from now on, gets
// them at once. The plugin calls it when it stops, after its other tasks ended.
func (h *handover) letGo() { h.letOnce.Do(func() { close(h.release) }) }

// successorTook reports, after letGo, whether a successor that was waiting takes the
// devices: it waits for such a successor's answer to the release (at once, unless it hung
// up meanwhile).
func (h *handover) successorTook() bool {
	for h.waiting.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	return isClosed(h.retired)
}

// serve waits for a successor and, once released (letGo), hands over to it; cancel stops
// the plugin's other tasks. A successor that hangs up while it waits is forgotten and the
// next one awaited.
func (h *handover) serve(cancel context.CancelFunc) {
	defer close(h.done)
	var req *kernel.HandoverRequest
	for {
		var err error
		req, err = h.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				klog.ErrorS(err, "Handover socket")
			}
			return
		}
		h.waiting.Store(true)
		if !isClosed(h.release) {
			klog.InfoS("A successor waits for the NBD devices: they go to it when this process is told to stop")
		}
		err = req.Hold(h.release)
		if err == nil {
			close(h.retired) // before waiting clears: successorTook reads them in that order
			h.waiting.Store(false)
			break
		}
		h.waiting.Store(false)
		klog.InfoS("The waiting successor went away; serving on", "err", err)
	}
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

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (h *handover) fail(err error) {
	klog.ErrorS(err, "Handover failed: the devices are left to a reattach")
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

// stop releases the devices (letGo), waits up to wait for a successor (0: none), then stops
// listening and waits for a handover in progress. It reports whether the devices went (or
// were meant to go) to a successor, and the handover's error.
func (h *handover) stop(wait time.Duration) (bool, error) {
	h.letGo()
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

// stopSequence hands the devices on once the plugin's tasks ended (runErr is their
// error; toldToStop: its context ended, rather than a successor taking the devices)
// and returns the plugin's result. Its steps:
//
//  1. to a successor: one that waits now, or connects from now on, gets the devices;
//  2. to the holder: on a planned stop that no successor waited for, if a holder listens;
//  3. wait: with no holder either, the devices stay served for up to wait while a
//     successor may come.
func (h *handover) stopSequence(stateDir string, wait time.Duration, runErr error, toldToStop bool) error {
	h.letGo()
	if !toldToStop || runErr != nil || h.successorTook() {
		return h.finish(0, runErr)
	}
	gone, err := h.giveToHolder(stateDir)
	if gone {
		return err
	}
	if !errors.Is(err, kernel.ErrNoHolder) {
		klog.ErrorS(err, "No handover to the holder")
	}
	return h.finish(wait, runErr)
}

// finish waits up to wait for a successor and ends the handover side: runErr, joined with
// the handover's error when a successor has the devices.
func (h *handover) finish(wait time.Duration, runErr error) error {
	retired, err := h.stop(wait)
	if !retired {
		return runErr
	}
	return errors.Join(runErr, err)
}

// errSuccessorCame ends a give to the holder that a successor overtook.
var errSuccessorCame = errors.New("a successor took the devices")

// giveToHolder hands every device to the holder (raid10-csi --mode=holder) serving
// --state-dir, if one listens: the way a planned stop goes when no successor runs beside this
// process (a rolling update deletes the old pod before it creates the new one). It reports
// whether the devices left this process (to the holder, or to a successor that came first),
// with the error of the give; kernel.ErrNoHolder when there is no holder (nothing was done).
func (h *handover) giveToHolder(stateDir string) (bool, error) {
	path, err := holderPath(stateDir)
	if err != nil {
		return false, err
	}
	ctx, stop := context.WithTimeout(context.Background(), handoverTimeout)
	defer stop()
	start := time.Now()
	var drained, closed time.Duration
	devs, err := kernel.GiveHandover(ctx, path, func() ([]kernel.Handed, error) {
		// No successor may take the devices from now on (one that came already has them).
		if retired, err := h.stop(0); retired {
			return nil, errors.Join(errSuccessorCame, err)
		}
		devs, err := h.np.attacher.HandOver(ctx)
		if err != nil {
			return nil, err
		}
		drained = time.Since(start)
		if err := h.np.pool.Close(); err != nil {
			klog.ErrorS(err, "Closing the pool for the holder")
		}
		closed = time.Since(start)
		return devs, nil
	})
	for i := range devs {
		devs[i].Close() // the holder keeps its own duplicates
	}
	switch {
	case errors.Is(err, kernel.ErrNoHolder):
		return false, err
	case errors.Is(err, errSuccessorCame):
		_, herr := h.stop(0)
		return true, herr
	case err != nil:
		return true, fmt.Errorf("hand the NBD devices to the holder: %w", err)
	}
	klog.InfoS("Handed the NBD devices to the holder", "devices", len(devs),
		"drained", drained, "poolClosed", closed, "total", time.Since(start))
	return true, nil
}

// takeHandover takes the devices of a predecessor serving --state-dir, or else those the
// holder keeps (none when neither listens: a first start, or a restart after a crash). A
// predecessor that still serves (a surge update: it has not been told to stop) keeps them
// until it is: waiting is then called and takeHandover waits, for as long as ctx allows.
func takeHandover(ctx context.Context, stateDir string, waiting func()) ([]kernel.Handed, error) {
	start := time.Now()
	path, err := handoverPath(stateDir)
	if err != nil {
		return nil, err
	}
	devs, err := kernel.TakeHandover(ctx, path, kernel.TakeOptions{Timeout: handoverTimeout, Waiting: func() {
		klog.InfoS("Waiting for the predecessor to be told to stop: it hands the NBD devices over then", "socket", path)
		if waiting != nil {
			waiting()
		}
	}})
	if err != nil {
		return nil, err
	}
	from := "predecessor"
	if devs == nil {
		from = "holder"
		if path, err = holderPath(stateDir); err != nil {
			return nil, err
		}
		if devs, err = kernel.TakeHandover(ctx, path, kernel.TakeOptions{Timeout: handoverTimeout}); err != nil {
			return nil, err
		}
	}
	if len(devs) > 0 {
		klog.InfoS("Took the NBD devices over", "from", from, "devices", len(devs), "took", time.Since(start))
	}
	return devs, nil
}

// holderPath is the holder's socket, beside the handover socket.
func holderPath(stateDir string) (string, error) {
	p, err := handoverPath(stateDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(p), kernel.HolderSocket), nil
}
