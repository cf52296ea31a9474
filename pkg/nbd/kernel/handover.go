package kernel

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// HandoverSocket is the name of the handover socket in the state directory.
const HandoverSocket = "handover.sock"

// ErrHandover wraps every failure of the handover protocol.
var ErrHandover = errors.New("kernel: handover")

// Handed is one device that HandOver took out of an Attacher, for a successor to Adopt: the
// device's record, and its connections, still open, each with the bytes read from it and not
// executed.
type Handed struct {
	VolumeID string
	Record   Record
	// Slots is the device's number of connections; Conns may hold fewer (a connection that
	// was being replaced): the successor replaces the missing ones with RECONFIGURE.
	Slots int
	Conns []nbd.Handoff
}

// Close closes the connections (a handover that failed: the kernel then sees them end).
func (h *Handed) Close() {
	for _, c := range h.Conns {
		_ = c.Conn.Close()
	}
}

// HandOver stops serving every device for a successor process, without the kernel noticing:
// no connection is replaced any more, each connection stops at a request boundary once every
// request read from it is answered (nbd.Server.HandOver), and the devices are returned with
// their open connections and forgotten here; they stay attached and recorded. If ctx ends
// first, the connections are closed (the kernel sees them end, as after a crash) and ctx's
// error is returned.
func (a *Attacher) HandOver(ctx context.Context) ([]Handed, error) {
	a.closing.Store(true)
	err := a.srv.HandOver(ctx)
	a.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Handed, 0, len(a.devs))
	for id, d := range a.devs {
		d.mu.Lock()
		out = append(out, Handed{VolumeID: id, Slots: a.opts.Connections,
			Record: Record{Index: d.Index, BackendID: d.cfg.BackendID, Export: d.export}, Conns: d.handed})
		d.handed = nil
		d.mu.Unlock()
		delete(a.devs, id)
	}
	if err != nil {
		for i := range out {
			out[i].Close()
		}
		return nil, err
	}
	return out, nil
}

// Adopt serves a device handed over by a predecessor (HandOver, in another process) on
// export: its connections are served from where the predecessor stopped, the slots without
// one are replaced with RECONFIGURE, and the volume is recorded in the state file. A device
// that no longer carries the volume's backend identifier is not taken: its connections are
// closed and ErrNotOwner (or the check's error) returned.
func (a *Attacher) Adopt(h Handed, export string) (*Device, error) {
	if a.closing.Load() {
		h.Close()
		return nil, ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.devs[h.VolumeID]; ok {
		h.Close()
		return nil, fmt.Errorf("%w: volume %q is attached here already", ErrHandover, h.VolumeID)
	}
	info, err := a.srv.Info(export)
	if err != nil {
		h.Close()
		return nil, err
	}
	rec := Record{Index: h.Record.Index, BackendID: BackendID(h.VolumeID), Export: export}
	owned, err := a.owned(rec)
	if err == nil && !owned {
		err = fmt.Errorf("%w: %s is not configured", ErrNotOwner, DevicePath(rec.Index))
	}
	if err != nil {
		h.Close()
		return nil, err
	}
	if old, ok := a.state.Get(h.VolumeID); !ok || old != rec {
		if err := a.state.Put(h.VolumeID, rec); err != nil {
			h.Close()
			return nil, err
		}
	}
	d := &Device{VolumeID: h.VolumeID, Index: rec.Index, Reattached: true, a: a, export: export, idleSince: time.Now(),
		cfg: Config{Size: info.Size, BlockSize: a.opts.BlockSize, Timeout: a.opts.Timeout,
			DeadConnTimeout: a.opts.DeadConnTimeout, ServerFlags: uint64(info.Flags), BackendID: rec.BackendID}}
	live := 0
	for _, c := range h.Conns {
		if peerGone(c.Conn) {
			// The kernel timed a request out on it while it was handed over, requeued it
			// and shut the socket down: what it still holds never runs. The slot is
			// replaced like any connection that ended.
			_ = c.Conn.Close()
			continue
		}
		live++
		d.wg.Add(1)
		go d.keepServed(c.Conn, c.Unread)
	}
	for i := live; i < max(h.Slots, len(h.Conns)); i++ {
		d.wg.Add(1)
		go d.keepServed(nil, nil)
	}
	a.devs[h.VolumeID] = d
	a.tune(d)
	klog.InfoS("Adopted NBD device", "volumeID", h.VolumeID, "device", d.Path(), "connections", live, "replaced", max(h.Slots, len(h.Conns))-live)
	return d, nil
}

// The handover protocol, over a unix stream socket in the state directory that the serving
// process listens on (ListenHandover). A starting process connects (TakeHandover) before it
// opens any volume and asks. A serving process that is not stopping yet answers "wait"
// (HandoverRequest.Hold) and goes on serving; when it is told to stop (or at once, when it
// was stopping already) it hands over, closes its volumes, sends every device and exits. A
// successor that hangs up while it waits is forgotten. A Holder (holder.go) speaks the same
// protocol on its own socket, never says "wait", and also takes devices from a stopping
// process, which connects and says "R10GIVE1" before it stops serving, then sends them as
// below and waits for the acknowledgement.
//
//	successor -> predecessor  "R10TAKE1"
//	predecessor -> successor  optionally "R10WAIT1" and 8 zero bytes (a header's size, no
//	                          socket): it still serves; the devices follow when it stops
//	predecessor -> successor  per device: header, JSON of a wireDevice; the header carries
//	                          the device's sockets (SCM_RIGHTS), one per wireDevice.Conns entry
//	                          header = "R10HAND1" | JSON length u32 | socket count u32 (big-endian)
//	predecessor -> successor  end: a header with JSON length 0 and no socket
//	successor -> predecessor  "R10ACK01" once it holds every socket
//
// A socket is passed as a duplicate: the kernel's end never sees it end.
var (
	magicTake = [8]byte{'R', '1', '0', 'T', 'A', 'K', 'E', '1'}
	magicGive = [8]byte{'R', '1', '0', 'G', 'I', 'V', 'E', '1'}
	magicHand = [8]byte{'R', '1', '0', 'H', 'A', 'N', 'D', '1'}
	magicAck  = [8]byte{'R', '1', '0', 'A', 'C', 'K', '0', '1'}
	magicWait = [8]byte{'R', '1', '0', 'W', 'A', 'I', 'T', '1'}
)

// ErrSuccessorGone is a successor that hung up while it waited for the devices (Hold).
var ErrSuccessorGone = fmt.Errorf("%w: the successor hung up", ErrHandover)

const handHeaderSize = 16

type wireDevice struct {
	VolumeID string     `json:"volumeID"`
	Record   Record     `json:"record"`
	Slots    int        `json:"slots"`
	Conns    []wireConn `json:"conns"`
}

type wireConn struct {
	Unread []byte `json:"unread,omitempty"`
}

// HandoverListener is the serving side of the handover socket.
type HandoverListener struct {
	ln *net.UnixListener
}

// ListenHandover listens on the handover socket at path (mode 0600; a stale socket is
// replaced). Its directory must be private, as nbd.Listen checks.
func ListenHandover(path string) (*HandoverListener, error) {
	ln, err := nbd.Listen(path)
	if err != nil {
		return nil, err
	}
	return &HandoverListener{ln: ln}, nil
}

// Close stops listening (and removes the socket).
func (l *HandoverListener) Close() error { return l.ln.Close() }

// Accept waits for a successor's request. It returns net.ErrClosed after Close.
func (l *HandoverListener) Accept() (*HandoverRequest, error) {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		var m [8]byte
		if _, err := io.ReadFull(c, m[:]); err != nil || m != magicTake {
			klog.InfoS("Ignoring a bad handover request", "err", err)
			_ = c.Close()
			continue
		}
		_ = c.SetDeadline(time.Time{})
		return &HandoverRequest{c: c}, nil
	}
}

// HandoverRequest is a successor waiting for the devices.
type HandoverRequest struct {
	c *net.UnixConn
}

// Refuse closes the request without handing anything over: the successor's TakeHandover
// fails.
func (r *HandoverRequest) Refuse() { _ = r.c.Close() }

// Hold tells the successor that this process still serves and hands over only when it is
// told to stop, then waits: it returns nil once release is closed (Send follows), or
// ErrSuccessorGone, the request closed, when the successor hangs up first (its process was
// stopped while it waited). With release already closed it returns nil at once and says
// nothing: the successor gets the devices straight away, as from a process that is stopping.
func (r *HandoverRequest) Hold(release <-chan struct{}) error {
	select {
	case <-release:
		return nil
	default:
	}
	var h [handHeaderSize]byte
	copy(h[:], magicWait[:])
	_ = r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.c.Write(h[:]); err != nil {
		r.Refuse()
		return fmt.Errorf("%w: %w", ErrSuccessorGone, err)
	}
	_ = r.c.SetWriteDeadline(time.Time{})
	// The successor sends nothing more before the acknowledgement: a read that returns is
	// a successor that hung up (or broke the protocol).
	gone := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := r.c.Read(b[:])
		if err == nil {
			err = errors.New("it sent data while waiting")
		}
		gone <- err
	}()
	select {
	case <-release:
		_ = r.c.SetReadDeadline(time.Unix(1, 0)) // wake the reader
		err := <-gone
		_ = r.c.SetReadDeadline(time.Time{})
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		r.Refuse()
		return fmt.Errorf("%w: %w", ErrSuccessorGone, err)
	case err := <-gone:
		r.Refuse()
		return fmt.Errorf("%w: %w", ErrSuccessorGone, err)
	}
}

// Send passes the devices to the successor and waits (up to ctx) for its acknowledgement.
// The caller closes the devices' connections afterwards, whatever the outcome: on success
// the successor holds its own duplicates.
func (r *HandoverRequest) Send(ctx context.Context, devs []Handed) error {
	defer func() { _ = r.c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = r.c.SetDeadline(dl)
	}
	if err := sendDevices(r.c, devs); err != nil {
		return err
	}
	if err := readAck(r.c); err != nil {
		return err
	}
	return nil
}

// sendDevices writes every device, its sockets attached, then the end header.
func sendDevices(c *net.UnixConn, devs []Handed) error {
	for _, d := range devs {
		w := wireDevice{VolumeID: d.VolumeID, Record: d.Record, Slots: d.Slots}
		fds := make([]int, 0, len(d.Conns))
		var files []*os.File
		for _, hc := range d.Conns {
			f, err := dupFile(hc.Conn)
			if err != nil {
				for _, f := range files {
					_ = f.Close()
				}
				return fmt.Errorf("%w: connection of %s: %w", ErrHandover, d.VolumeID, err)
			}
			files = append(files, f)
			fds = append(fds, int(f.Fd()))
			w.Conns = append(w.Conns, wireConn{Unread: hc.Unread})
		}
		b, err := json.Marshal(w)
		if err == nil {
			err = sendMsg(c, b, fds)
		}
		for _, f := range files {
			_ = f.Close()
		}
		if err != nil {
			return err
		}
	}
	return sendMsg(c, nil, nil)
}

// dupFile returns a duplicate of a connection's socket.
func dupFile(nc net.Conn) (*os.File, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("a %T has no socket", nc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var fd int
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	return os.NewFile(uintptr(fd), "nbd-server"), nil
}

func sendMsg(c *net.UnixConn, b []byte, fds []int) error {
	var h [handHeaderSize]byte
	copy(h[:], magicHand[:])
	binary.BigEndian.PutUint32(h[8:], uint32(len(b)))
	binary.BigEndian.PutUint32(h[12:], uint32(len(fds)))
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(h[:], oob, nil); err != nil {
		return fmt.Errorf("%w: send: %w", ErrHandover, err)
	}
	if len(b) == 0 {
		return nil // the end: the peer may close as soon as it has read the header
	}
	if _, err := c.Write(b); err != nil {
		return fmt.Errorf("%w: send: %w", ErrHandover, err)
	}
	return nil
}

// TakeOptions tunes TakeHandover.
type TakeOptions struct {
	// Timeout bounds each step the peer takes at once: its first answer, and the devices
	// from the first header to the last. 0: only ctx bounds them.
	Timeout time.Duration
	// Waiting, when not nil, is called once if the peer answers that it still serves and
	// hands over when it is told to stop (HandoverRequest.Hold). TakeHandover then waits for
	// the devices for as long as ctx allows, without Timeout: a surge update's new pod waits
	// so until the DaemonSet stops the old one.
	Waiting func()
}

// TakeHandover asks the process serving the handover socket at path (a predecessor, or a
// Holder) for its devices. It returns nil and no error when no process listens there (a
// first start, or after a crash: the devices are then reattached from the state file), or
// when the predecessor ended the request without a word (it was handing its devices to a
// Holder meanwhile, or it was stopped while this process waited). On success the
// predecessor has closed its volumes: the caller may open them, then Adopt each device. On
// an error whatever was received is closed; when ctx ends the error wraps ctx's.
func TakeHandover(ctx context.Context, path string, o TakeOptions) ([]Handed, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", ErrHandover, path, err)
	}
	defer func() { _ = c.Close() }()
	// ctx ends the exchange at any step, through a deadline in the past; a step's own
	// deadline set afterwards must not undo that.
	stopped := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stopped()
	step := func() {
		dl := time.Time{}
		if o.Timeout > 0 {
			dl = time.Now().Add(o.Timeout)
		}
		_ = c.SetDeadline(dl)
		if ctx.Err() != nil {
			_ = c.SetDeadline(time.Unix(1, 0))
		}
	}
	step()
	if _, err := c.Write(magicTake[:]); err != nil {
		return nil, nil // refused before it read the request
	}
	waited := false
	out, err := recvDevices(c, &recvHooks{
		wait: func() {
			waited = true
			_ = c.SetDeadline(time.Time{})
			if ctx.Err() != nil {
				_ = c.SetDeadline(time.Unix(1, 0))
			}
			if o.Waiting != nil {
				o.Waiting()
			}
		},
		first: func() {
			if waited {
				step() // the predecessor was told to stop: the devices come now
			}
		},
	})
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%w: waiting for %s: %w", ErrHandover, path, ctx.Err())
	}
	if errors.Is(err, errRefused) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(magicAck[:]); err != nil {
		closeAll(out)
		return nil, fmt.Errorf("%w: acknowledge: %w", ErrHandover, err)
	}
	if out == nil {
		out = []Handed{}
	}
	return out, nil
}

// readAck reads the peer's acknowledgement.
func readAck(c *net.UnixConn) error {
	var m [8]byte
	if _, err := io.ReadFull(c, m[:]); err != nil {
		return fmt.Errorf("%w: no acknowledgement: %w", ErrHandover, err)
	}
	if m != magicAck {
		return fmt.Errorf("%w: acknowledgement %q", ErrHandover, m[:])
	}
	return nil
}

// errRefused is a peer that closed the handover before its first header.
var errRefused = errors.New("kernel: handover refused")

func closeAll(devs []Handed) {
	for i := range devs {
		devs[i].Close()
	}
}

// recvHooks are what a successor does at the steps of recvDevices.
type recvHooks struct {
	wait  func() // the peer said "wait" (HandoverRequest.Hold)
	first func() // the first header after the peer's answer began (a device, or the end)
}

// recvDevices reads devices up to the end header. With hooks (a successor's TakeHandover)
// the peer may say "wait" before it answers: hooks.wait is called and the answer read after
// it; hooks.first is called at the answer's first header.
func recvDevices(c *net.UnixConn, hooks *recvHooks) ([]Handed, error) {
	var out []Handed
	fail := func(err error) ([]Handed, error) {
		closeAll(out)
		return nil, fmt.Errorf("%w: %w", ErrHandover, err)
	}
	oob := make([]byte, unix.CmsgSpace(4*253))
	waited := false
	for first := true; ; {
		var h [handHeaderSize]byte
		n, oobn, _, _, err := c.ReadMsgUnix(h[:], oob)
		if first && n == 0 && (err == nil || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			// Nothing at all, or nothing after a wait: the predecessor handed to a holder,
			// or stopped without a word.
			return nil, errRefused
		}
		if err != nil {
			return fail(err)
		}
		if first && hooks != nil && !waited && oobn == 0 {
			if n < handHeaderSize {
				if _, err := io.ReadFull(c, h[n:]); err != nil {
					return fail(err)
				}
				n = handHeaderSize
			}
			if [8]byte(h[:8]) == magicWait {
				waited = true
				hooks.wait()
				continue // the answer proper is still to come
			}
		}
		if first && hooks != nil && hooks.first != nil {
			hooks.first()
		}
		first = false
		var fds []int
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return fail(err)
			}
			for _, m := range msgs {
				got, err := unix.ParseUnixRights(&m)
				if err != nil {
					return fail(err)
				}
				fds = append(fds, got...)
			}
		}
		conns := make([]net.Conn, 0, len(fds))
		closeConns := func() {
			for _, nc := range conns {
				_ = nc.Close()
			}
		}
		for i, fd := range fds {
			f := os.NewFile(uintptr(fd), "nbd-server")
			nc, err := net.FileConn(f)
			_ = f.Close()
			if err != nil {
				closeConns()
				for _, fd := range fds[i+1:] {
					_ = unix.Close(fd)
				}
				return fail(err)
			}
			conns = append(conns, nc)
		}
		if n < handHeaderSize {
			if _, err := io.ReadFull(c, h[n:]); err != nil {
				closeConns()
				return fail(err)
			}
		}
		if [8]byte(h[:8]) != magicHand || int(binary.BigEndian.Uint32(h[12:])) != len(conns) {
			closeConns()
			return fail(fmt.Errorf("bad header %x with %d sockets", h, len(conns)))
		}
		size := binary.BigEndian.Uint32(h[8:])
		if size == 0 {
			closeConns()
			return out, nil
		}
		b := make([]byte, size)
		if _, err := io.ReadFull(c, b); err != nil {
			closeConns()
			return fail(err)
		}
		var w wireDevice
		if err := json.Unmarshal(b, &w); err != nil || len(w.Conns) != len(conns) {
			closeConns()
			if err == nil {
				err = fmt.Errorf("%d sockets for %d connections", len(conns), len(w.Conns))
			}
			return fail(fmt.Errorf("bad device %q: %w", b, err))
		}
		d := Handed{VolumeID: w.VolumeID, Record: w.Record, Slots: w.Slots}
		for i, nc := range conns {
			d.Conns = append(d.Conns, nbd.Handoff{Conn: nc, Unread: w.Conns[i].Unread})
		}
		out = append(out, d)
	}
}
