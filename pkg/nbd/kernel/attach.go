package kernel

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// Defaults of Options.
const (
	DefaultConnections = 2
	// DefaultTimeout is the kernel's request timeout: the stall of the requests in flight
	// when the serving process dies (they are requeued when it expires). It stays twice the
	// engine's member timeout (raid10, 5 s), so that a request the engine completes after
	// failing a hung member is never timed out by the kernel.
	DefaultTimeout = 10 * time.Second
	// DefaultDeadConnTimeout is how long the kernel queues requests while no connection
	// lives before it fails them: long enough for a slow restart of the plugin's pod (an
	// image pull, a crash-loop back-off of up to 5 minutes).
	DefaultDeadConnTimeout = 10 * time.Minute
	backendPrefix          = "raid10-csi:"
)

// Errors of the attach.
var (
	// ErrNotOwner is returned when the device recorded for a volume now carries another
	// backend identifier: someone else configured it, so it is left alone.
	ErrNotOwner = errors.New("kernel: device is owned by another backend")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("kernel: attacher closed")
	// ErrNotAttached is returned by Resize for a volume this attacher has not attached.
	ErrNotAttached = errors.New("kernel: volume is not attached here")
	// ErrShrink is returned by Resize when the export is smaller than the device: the
	// kernel would cut off a mounted filesystem, so it is never asked to.
	ErrShrink = errors.New("kernel: export is smaller than its device")
)

// Options tune an Attacher. The zero value takes every default.
type Options struct {
	// Connections per device (the kernel spreads requests over them).
	Connections int
	// Timeout of one request in the kernel; expired requests are requeued.
	Timeout time.Duration
	// DeadConnTimeout is how long the kernel queues requests while no connection lives:
	// the time a restarted process has to RECONFIGURE.
	DeadConnTimeout time.Duration
	// BlockSize of the device (default 4096).
	BlockSize int64
	// MaxRequestKiB is the largest request the block layer builds for the device
	// (queue/max_sectors_kb, TuneQueue), capped at the driver's max_hw_sectors_kb and the
	// server's MaxRequestSize. Default DefaultMaxRequestKiB (1 MiB); negative: the kernel's
	// default (128 KiB) is left alone.
	MaxRequestKiB int
	// NetNS is the network namespace file whose nbd netlink family the node plugin dials
	// (DialNetNS; attach.OpenPoolAttacher), e.g. /proc/1/ns/net with the host's PID
	// namespace; empty: the process's own. The Attacher itself does not use it.
	NetNS string
}

func (o Options) withDefaults() Options {
	if o.Connections <= 0 {
		o.Connections = DefaultConnections
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.DeadConnTimeout <= 0 {
		o.DeadConnTimeout = DefaultDeadConnTimeout
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 4096
	}
	if o.MaxRequestKiB == 0 {
		o.MaxRequestKiB = DefaultMaxRequestKiB
	}
	return o
}

// Attacher attaches exports of an nbd.Server to /dev/nbdX devices and keeps every
// connection of every device served: a connection that ends while its device is attached is
// replaced by a fresh one through NBD_CMD_RECONFIGURE.
type Attacher struct {
	srv   *nbd.Server
	nl    *Netlink
	state *State
	opts  Options

	mu      sync.Mutex
	devs    map[string]*Device
	closing atomic.Bool
}

// Device is one attached volume.
type Device struct {
	VolumeID string
	Index    uint32
	// Reattached is true when the device was found configured (from the state file) and
	// its connections were replaced rather than created.
	Reattached bool

	a          *Attacher
	export     string
	cfg        Config
	detaching  atomic.Bool
	wg         sync.WaitGroup
	reconnects atomic.Int64

	mu        sync.Mutex
	live      map[net.Conn]struct{} // server ends being served
	idleSince time.Time             // when live last became empty (or the Device was made)
	handed    []nbd.Handoff         // connections HandOver took out (handover.go)
}

// Path is the device node.
func (d *Device) Path() string { return DevicePath(d.Index) }

// Reconnects counts connections replaced since the attach.
func (d *Device) Reconnects() int64 { return d.reconnects.Load() }

// Unserved is how long the device has had no connection served: 0 while one is. It is
// short right after the attach and during a reconnect, and grows for good when every
// connection gave up (the device was disconnected or taken over behind our back).
func (d *Device) Unserved() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.live) > 0 {
		return 0
	}
	return time.Since(d.idleSince)
}

// NewAttacher returns an attacher serving devices from srv.
func NewAttacher(srv *nbd.Server, nl *Netlink, state *State, opts Options) *Attacher {
	return &Attacher{srv: srv, nl: nl, state: state, opts: opts.withDefaults(), devs: map[string]*Device{}}
}

// BackendID is the identifier a volume's device carries in the kernel.
func BackendID(volumeID string) string { return backendPrefix + volumeID }

// Attach serves export on a device for volumeID. If the state file records a device for the
// volume that is still configured with the volume's backend identifier (the process was
// restarted), its connections are replaced with NBD_CMD_RECONFIGURE and no request above it
// fails; otherwise (the device is gone, or after a reboot serves another backend) the stale
// record is dropped and a free device is connected. Attaching an attached volume returns its
// device.
func (a *Attacher) Attach(volumeID, export string) (*Device, error) {
	if a.closing.Load() {
		return nil, ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if d, ok := a.devs[volumeID]; ok {
		return d, nil
	}
	info, err := a.srv.Info(export)
	if err != nil {
		return nil, err
	}
	d := &Device{VolumeID: volumeID, a: a, export: export, idleSince: time.Now(), cfg: Config{
		Size:            info.Size,
		BlockSize:       a.opts.BlockSize,
		Timeout:         a.opts.Timeout,
		DeadConnTimeout: a.opts.DeadConnTimeout,
		ServerFlags:     uint64(info.Flags),
		BackendID:       BackendID(volumeID),
	}}
	if rec, ok := a.state.Get(volumeID); ok {
		owned, err := a.owned(rec)
		switch {
		case errors.Is(err, ErrNotOwner):
			// The record is stale: after a reboot a fresh attach of another volume may take
			// the device this one had (found by the first real node reboot, test/cluster).
			// That device is not ours to touch; this volume gets a new one below.
			klog.InfoS("Recorded NBD device now serves another backend, connecting a new one", "volumeID", volumeID, "device", DevicePath(rec.Index), "reason", err)
		case err != nil:
			return nil, err
		}
		if owned {
			d.Index = rec.Index
			d.Reattached = true
			for i := 0; i < a.opts.Connections; i++ {
				d.wg.Add(1)
				go d.keepServed(nil, nil)
			}
			a.devs[volumeID] = d
			a.tune(d)
			klog.InfoS("Reattaching NBD device", "volumeID", volumeID, "device", d.Path())
			return d, nil
		}
		if err == nil {
			klog.InfoS("Recorded NBD device is gone, connecting a new one", "volumeID", volumeID, "device", DevicePath(rec.Index))
		}
		if err := a.state.Delete(volumeID); err != nil {
			return nil, err
		}
	}

	// Listed as being connected until recorded: a Reclaim meanwhile, in any process, leaves
	// the device alone.
	done, err := a.state.connecting(volumeID)
	if err != nil {
		return nil, err
	}
	defer done()
	servers := make([]net.Conn, 0, a.opts.Connections)
	kernels := make([]*os.File, 0, a.opts.Connections)
	defer func() {
		for _, k := range kernels {
			_ = k.Close()
		}
	}()
	for i := 0; i < a.opts.Connections; i++ {
		s, k, err := socketPair()
		if err != nil {
			for _, s := range servers {
				_ = s.Close()
			}
			return nil, err
		}
		servers = append(servers, s)
		kernels = append(kernels, k)
	}
	cfg := d.cfg
	cfg.Sockets = kernels
	idx, err := a.nl.Connect(-1, cfg)
	if err != nil {
		for _, s := range servers {
			_ = s.Close()
		}
		return nil, err
	}
	d.Index = idx
	if err := a.state.Put(volumeID, Record{Index: idx, BackendID: d.cfg.BackendID, Export: export}); err != nil {
		_ = a.nl.Disconnect(idx)
		for _, s := range servers {
			_ = s.Close()
		}
		return nil, err
	}
	for _, s := range servers {
		d.wg.Add(1)
		go d.keepServed(s, nil)
	}
	a.devs[volumeID] = d
	a.tune(d)
	klog.InfoS("Attached NBD device", "volumeID", volumeID, "device", d.Path(), "connections", a.opts.Connections)
	return d, nil
}

// tune sets the device's request queue (TuneQueue): requests up to Options.MaxRequestKiB,
// no scheduler. A failure (a read-only /sys) costs speed, not data: it is logged and the
// device stays attached.
func (a *Attacher) tune(d *Device) {
	kib := a.opts.MaxRequestKiB
	if kib > 0 {
		kib = min(kib, a.srv.MaxRequestSize()>>10)
	}
	s, err := TuneQueue(d.Index, kib)
	if err != nil {
		klog.ErrorS(err, "Tuning the NBD device's request queue; large requests may arrive split", "volumeID", d.VolumeID, "device", d.Path())
		return
	}
	klog.V(2).InfoS("Tuned NBD request queue", "volumeID", d.VolumeID, "device", d.Path(),
		"maxSectorsKiB", s.MaxSectorsKiB, "maxHWSectorsKiB", s.MaxHWSectorsKiB, "scheduler", s.Scheduler)
}

// owned reports whether the recorded device is configured and carries the record's backend
// identifier; a device configured by someone else is ErrNotOwner.
func (a *Attacher) owned(rec Record) (bool, error) {
	st, err := a.nl.Status(int(rec.Index))
	if err != nil {
		return false, err
	}
	if len(st) == 0 || !st[0].Connected {
		return false, nil
	}
	id, err := BackendOf(rec.Index)
	if err != nil {
		return false, err
	}
	if id != rec.BackendID {
		return false, fmt.Errorf("%w: %s has backend %q, want %q", ErrNotOwner, DevicePath(rec.Index), id, rec.BackendID)
	}
	return true, nil
}

// keepServed serves one connection slot of the device until it is detached or the attacher
// closes. conn is the server end of a socket the kernel already has, unread what an earlier
// server read from it and did not execute (handover.go); a nil conn means a new pair must
// first be handed over with RECONFIGURE.
func (d *Device) keepServed(conn net.Conn, unread []byte) {
	defer d.wg.Done()
	backoff := 50 * time.Millisecond
	failures := 0 // consecutive failed reconnects: logged at 1, 2, 4, 8... (a device gone for good would log every 2 s)
	for {
		if conn == nil {
			if d.detaching.Load() || d.a.closing.Load() {
				return
			}
			s, k, err := socketPair()
			if err == nil {
				cfg := d.cfg
				cfg.Sockets = []*os.File{k}
				err = d.a.nl.Reconfigure(d.Index, cfg)
				_ = k.Close()
				if err != nil {
					_ = s.Close()
				} else {
					conn = s
					d.reconnects.Add(1)
					failures = 0
				}
			}
			if err != nil {
				if failures++; failures&(failures-1) == 0 {
					klog.ErrorS(err, "Reconnecting NBD device", "volumeID", d.VolumeID, "device", d.Path(), "failures", failures)
				}
				if owned, oerr := d.a.owned(Record{Index: d.Index, BackendID: d.cfg.BackendID}); !owned && (oerr == nil || errors.Is(oerr, ErrNotOwner)) {
					// Disconnected or taken over by someone else: nothing left to serve.
					klog.ErrorS(oerr, "NBD device is no longer ours, giving up its connection", "volumeID", d.VolumeID, "device", d.Path())
					return
				}
				time.Sleep(backoff)
				backoff = min(2*backoff, 2*time.Second)
				continue
			}
		}
		start := time.Now()
		d.mu.Lock()
		if d.live == nil {
			d.live = map[net.Conn]struct{}{}
		}
		d.live[conn] = struct{}{}
		d.mu.Unlock()
		h, err := d.a.srv.ServeKernel(conn, d.export, unread)
		d.mu.Lock()
		delete(d.live, conn)
		if len(d.live) == 0 {
			d.idleSince = time.Now()
		}
		if h != nil {
			d.handed = append(d.handed, *h)
		}
		d.mu.Unlock()
		if h != nil {
			return
		}
		conn, unread = nil, nil
		if d.detaching.Load() || d.a.closing.Load() || errors.Is(err, nbd.ErrServerClosed) {
			return
		}
		if time.Since(start) > time.Second {
			backoff = 50 * time.Millisecond
		} else {
			// The kernel dropped the socket at once: it had no dead slot for it yet.
			time.Sleep(backoff)
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// Resize makes the volume's device as large as its export is now (after the backend grew)
// and returns the device's size in bytes as the block layer reports it. The device is resized
// in place (Netlink.Resize): its connections, its queue and a filesystem mounted on it are
// untouched. A device already of the export's size is left alone; an export smaller than the
// device is ErrShrink; a volume not attached here is ErrNotAttached.
func (a *Attacher) Resize(volumeID string) (int64, error) {
	a.mu.Lock()
	d := a.devs[volumeID]
	a.mu.Unlock()
	if d == nil {
		return 0, fmt.Errorf("%w: volume %q", ErrNotAttached, volumeID)
	}
	info, err := a.srv.Info(d.export)
	if err != nil {
		return 0, err
	}
	cur, err := DeviceSize(d.Index)
	if err != nil {
		return 0, err
	}
	switch {
	case info.Size == cur:
		return cur, nil
	case info.Size < cur:
		return cur, fmt.Errorf("%w: %s has %d bytes, volume %q only %d", ErrShrink, d.Path(), cur, volumeID, info.Size)
	}
	if err := a.nl.Resize(d.Index, d.cfg.BackendID, info.Size, a.opts.BlockSize); err != nil {
		return cur, err
	}
	got, err := DeviceSize(d.Index)
	if err != nil {
		return cur, err
	}
	if got != info.Size {
		return got, fmt.Errorf("kernel: %s has %d bytes after the resize to %d", d.Path(), got, info.Size)
	}
	klog.InfoS("Resized NBD device", "volumeID", volumeID, "device", d.Path(), "fromBytes", cur, "toBytes", got)
	return got, nil
}

// Detach disconnects the volume's device (the kernel sends NBD_CMD_DISC on every
// connection), waits for its connections to end and forgets it. A volume not attached is
// no error; a recorded device now owned by another backend is left alone.
func (a *Attacher) Detach(volumeID string) error {
	a.mu.Lock()
	d := a.devs[volumeID]
	delete(a.devs, volumeID)
	a.mu.Unlock()
	if d != nil {
		d.detaching.Store(true)
		if err := a.nl.Disconnect(d.Index); err != nil {
			return err
		}
		d.wg.Wait()
		return a.state.Delete(volumeID)
	}
	rec, ok := a.state.Get(volumeID)
	if !ok {
		return nil
	}
	owned, err := a.owned(rec)
	if err != nil && !errors.Is(err, ErrNotOwner) {
		return err
	}
	if owned {
		if err := a.nl.Disconnect(rec.Index); err != nil {
			return err
		}
	}
	return a.state.Delete(volumeID)
}

// Close stops replacing connections. Devices stay attached and recorded: a restarted process
// reattaches them. The caller shuts the nbd.Server down (which ends the connections).
func (a *Attacher) Close() {
	a.closing.Store(true)
}

// Wait waits until every connection goroutine has returned (after Close and the server's
// shutdown, or after Detach of every device).
func (a *Attacher) Wait() {
	a.mu.Lock()
	devs := make([]*Device, 0, len(a.devs))
	for _, d := range a.devs {
		devs = append(devs, d)
	}
	a.mu.Unlock()
	for _, d := range devs {
		d.wg.Wait()
	}
}

// socketPair returns a connected pair of unix stream sockets: the server's end as a
// net.Conn, the kernel's as a file to pass by number over netlink.
func socketPair() (net.Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("kernel: socketpair: %w", err)
	}
	for _, fd := range fds {
		setSendBuffer(fd)
	}
	sf := os.NewFile(uintptr(fds[0]), "nbd-server")
	c, err := net.FileConn(sf)
	_ = sf.Close()
	if err != nil {
		_ = unix.Close(fds[1])
		return nil, nil, fmt.Errorf("kernel: socketpair: %w", err)
	}
	return c, os.NewFile(uintptr(fds[1]), "nbd-kernel"), nil
}

// socketBuffer is the send buffer of both ends of a connection: a unix stream socket queues
// at most its sender's send buffer, and the default (net.core.wmem_default, 208 KiB) makes
// the kernel's 1 MiB write, and the server's 1 MiB read reply, cross in pieces, with a
// system call and a wake-up on each side for every piece.
const socketBuffer = 4 << 20

// setSendBuffer raises fd's send buffer to socketBuffer: past net.core.wmem_max with
// CAP_NET_ADMIN (SO_SNDBUFFORCE), else up to it. A failure only costs speed.
func setSendBuffer(fd int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, socketBuffer)
	}
}

// SetIOFlusher marks the process as an I/O flusher (PR_SET_IO_FLUSHER): its allocations do
// not recurse into filesystem or block I/O reclaim, which could wait on the very device it
// serves. Needs CAP_SYS_RESOURCE.
func SetIOFlusher() error {
	if err := unix.Prctl(unix.PR_SET_IO_FLUSHER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("kernel: PR_SET_IO_FLUSHER: %w", err)
	}
	return nil
}
