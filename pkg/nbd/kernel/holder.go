package kernel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// HolderSocket is the name of a Holder's socket, beside HandoverSocket.
const HolderSocket = "holder.sock"

// ErrNoHolder is returned by GiveHandover when no Holder listens.
var ErrNoHolder = errors.New("kernel: no holder listens")

// Holder keeps the devices of a stopped node plugin, their sockets open, until the next one
// takes them: what a rolling update needs, where the old process ends before the new one
// starts. It never reads the sockets: the kernel's requests wait in them (as they would in
// a slow server) and the next plugin serves them, so no request waits for the kernel's
// request timeout unless the gap between the two plugins is that long. A Holder is a process
// of its own that outlives the plugins (raid10-csi --mode=holder); if it dies while it holds
// devices, the kernel sees their connections end, as after a crash of the plugin.
type Holder struct {
	ln *net.UnixListener

	mu    sync.Mutex
	devs  []Handed
	since time.Time // when the devices held were given
}

// ListenHolder listens on the holder socket at path (mode 0600, in a private directory; a
// stale socket is replaced).
func ListenHolder(path string) (*Holder, error) {
	ln, err := nbd.Listen(path)
	if err != nil {
		return nil, err
	}
	return &Holder{ln: ln}, nil
}

// Held returns the number of devices held now.
func (h *Holder) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.devs)
}

// Close stops listening and closes the sockets of every device held.
func (h *Holder) Close() error {
	err := h.ln.Close()
	h.mu.Lock()
	closeAll(h.devs)
	h.devs = nil
	h.mu.Unlock()
	return err
}

// Serve takes and gives devices, one client at a time, until Close (then it returns nil).
func (h *Holder) Serve() error {
	for {
		c, err := h.ln.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		h.serveOne(c)
	}
}

func (h *Holder) serveOne(c *net.UnixConn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var m [8]byte
	if _, err := io.ReadFull(c, m[:]); err != nil {
		return
	}
	switch m {
	case magicGive:
		// The giver drains its connections and closes its arrays first: give it time.
		_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
		devs, err := recvDevices(c, nil)
		if errors.Is(err, errRefused) {
			klog.InfoS("The plugin gave nothing after all")
			return
		}
		if err != nil {
			klog.ErrorS(err, "Taking devices from a stopping plugin")
			return
		}
		h.mu.Lock()
		for _, d := range devs { // a volume given again replaces the one held
			for i := range h.devs {
				if h.devs[i].VolumeID == d.VolumeID {
					h.devs[i].Close()
					h.devs = append(h.devs[:i], h.devs[i+1:]...)
					break
				}
			}
			h.devs = append(h.devs, d)
		}
		h.since = time.Now()
		n := len(h.devs)
		h.mu.Unlock()
		klog.InfoS("Holding NBD devices for the next plugin", "given", len(devs), "held", n)
		if _, err := c.Write(magicAck[:]); err != nil {
			// The giver gives up and closes its copies; these stay held for the next plugin.
			klog.ErrorS(err, "Acknowledging the devices of a stopping plugin")
		}
	case magicTake:
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := sendDevices(c, h.devs); err != nil {
			klog.ErrorS(err, "Giving the held devices to a plugin")
			return
		}
		if _, err := io.ReadFull(c, m[:]); err != nil || m != magicAck {
			klog.ErrorS(err, "The plugin did not acknowledge the held devices; still holding them")
			return
		}
		if len(h.devs) > 0 {
			klog.InfoS("Gave the held NBD devices to a plugin", "devices", len(h.devs), "heldFor", time.Since(h.since))
		}
		closeAll(h.devs) // the plugin holds its own duplicates
		h.devs = nil
	default:
		klog.InfoS("Ignoring a bad holder request", "magic", fmt.Sprintf("%x", m))
	}
}

// GiveHandover hands this process's devices to the Holder at path: it announces the give
// (so that a plugin starting meanwhile waits for the devices instead of finding none), then
// calls prepare, which stops serving and returns the devices (PoolAttacher.HandOver, after
// which the caller closes its arrays inside prepare), sends them and waits for the Holder's
// acknowledgement. Without a Holder it returns ErrNoHolder before calling prepare. The caller
// closes the devices' connections afterwards.
func GiveHandover(ctx context.Context, path string, prepare func() ([]Handed, error)) ([]Handed, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, ErrNoHolder
	}
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", ErrHandover, path, err)
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(magicGive[:]); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoHolder, err)
	}
	devs, err := prepare()
	if err != nil {
		return devs, err
	}
	if err := sendDevices(c, devs); err != nil {
		return devs, err
	}
	if err := readAck(c); err != nil {
		return devs, err
	}
	return devs, nil
}

// peerGone reports whether the kernel has shut its end of a handed-over socket down (it
// timed a request out and requeued it elsewhere): what the socket still holds is stale.
func peerGone(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	_ = raw.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil && n > 0 {
			gone = p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return gone
}
