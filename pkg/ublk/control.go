package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/uring"
)

// ControlPath is the ublk control device; it exists once the ublk_drv module is loaded.
const ControlPath = "/dev/ublk-control"

// Errors of this package.
var (
	// ErrUnavailable means the kernel offers no ublk here.
	ErrUnavailable = errors.New("ublk: " + ControlPath + " missing (kernel without CONFIG_BLK_DEV_UBLK, or ublk_drv not loaded)")
	// ErrNotRecoverable means a device cannot be taken over by a new server: it was added
	// without user recovery, or never started, or was stopped.
	ErrNotRecoverable = errors.New("ublk: device is not recoverable")
	// ErrNotOurs means a device was not added by this package (its server flags lack our mark).
	ErrNotOurs = errors.New("ublk: device was not added by raid10-csi")
	// ErrNoResize means the kernel cannot change a started device's size: its ublk_drv
	// lacks UBLK_U_CMD_UPDATE_SIZE (Linux 6.16).
	ErrNoResize = errors.New("ublk: the kernel cannot resize a served device (no UBLK_F_UPDATE_SIZE, which needs Linux 6.16+)")
)

// serverMark is stored in ublksrv_ctrl_dev_info.ublksrv_flags of every device this package
// adds ("r10c"), which the kernel keeps and returns: List tells ours from other servers'.
const serverMark = 0x72313063

// Available returns nil when the ublk control device exists, else ErrUnavailable.
func Available() error {
	if _, err := os.Stat(ControlPath); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// control sends one control command and waits for its completion. buf, if not nil, is the
// command's in/out buffer (addr, len): the kernel uses a pinned heap copy of it (kernelBuf),
// copied back into buf when the command completes. The commands START_DEV and
// END_USER_RECOVERY block in the kernel until every queue has fetched its requests; ctx ends
// the wait (the ring is closed, which interrupts the kernel's wait).
func control(ctx context.Context, cmd uint32, devID uint32, data uint64, buf []byte) error {
	f, err := os.OpenFile(ControlPath, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return fmt.Errorf("ublk: open %s: %w", ControlPath, err)
	}
	defer func() { _ = f.Close() }()
	r, err := uring.New(2, uring.SetupSQE128)
	if err != nil {
		return err
	}
	defer func() { _ = r.Close() }()
	c := ctrlCmd{devID: devID, queueID: 0xffff, data: data}
	kb := newKernelBuf(buf)
	if kb != nil {
		c.addr, c.len = uint64(uintptr(unsafe.Pointer(&kb.b[0]))), uint16(len(kb.b))
	}
	sqe, err := r.GetSQE()
	if err != nil {
		return err
	}
	sqe.PrepURingCmd(int(f.Fd()), ctrlOp[cmd])
	copy(r.Cmd(sqe), c.bytes())
	if _, err := r.Submit(); err != nil {
		return fmt.Errorf("ublk: %s device %d: %w", ctrlName[cmd], int32(devID), err)
	}
	if controlSubmitted != nil {
		controlSubmitted()
	}
	// Poll: a blocking wait could not be given up when ctx ends.
	wait := 50 * time.Microsecond
	for {
		if cqe, ok := r.PeekCQE(); ok {
			r.SeenCQE()
			kb.done(buf)
			if err := cqe.Err(); err != nil {
				return fmt.Errorf("ublk: %s device %d: %w", ctrlName[cmd], int32(devID), err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			kb.abandon()
			return fmt.Errorf("ublk: %s device %d: %w", ctrlName[cmd], int32(devID), ctx.Err())
		case <-time.After(wait):
		}
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
}

// controlSubmitted, when a test sets it, runs after each control command's submission (the
// kernel is then working on it): TestInGuestControlStack moves the goroutine's stack there.
var controlSubmitted func()

// kernelBuf is the copy of a control command's buffer that the kernel reads and writes.
//
// ublk_drv runs no control command inline (it answers io_uring's non-blocking attempt with
// EAGAIN), so each one completes on an io-wq worker after Submit has returned, while this
// goroutine polls for it; and a Go stack is copied elsewhere when it grows or shrinks. The
// callers' buffers (a DevInfo or Params variable) may live on the stack: the kernel then
// wrote GET_DEV_INFO's answer to where the stack had been, the caller read zeroes, and a
// restarted node plugin took its own device for someone else's ("not added by raid10-csi")
// and left the pod's I/O to fail (TestRestartUblkVM under load). The copy is on the heap and
// pinned, so it stays where the kernel was told until the command completes.
type kernelBuf struct {
	b   []byte
	pin runtime.Pinner
}

// abandoned keeps the buffers of commands given up on (ctx ended) while the kernel may
// still complete them: never reused, never freed.
var abandoned struct {
	sync.Mutex
	bufs [][]byte
}

// newKernelBuf copies buf into a pinned heap buffer; nil for an empty buf.
func newKernelBuf(buf []byte) *kernelBuf {
	if len(buf) == 0 {
		return nil
	}
	kb := &kernelBuf{b: make([]byte, len(buf))}
	kb.pin.Pin(&kb.b[0]) // escapes, so heap-allocated; and pinned
	copy(kb.b, buf)
	return kb
}

// done copies the kernel's answer back into buf once the command has completed.
func (kb *kernelBuf) done(buf []byte) {
	if kb == nil {
		return
	}
	copy(buf, kb.b)
	kb.pin.Unpin()
}

// abandon keeps the buffer alive for good: the kernel may still write it.
func (kb *kernelBuf) abandon() {
	if kb == nil {
		return
	}
	abandoned.Lock()
	abandoned.bufs = append(abandoned.bufs, kb.b)
	abandoned.Unlock()
	kb.pin.Unpin()
}

// Features returns the UBLK_F_* flags the running kernel supports (GET_FEATURES, 6.5+). They
// do not change while ublk_drv stays loaded.
func Features(ctx context.Context) (Flags, error) {
	var b [8]byte
	if err := control(ctx, cmdGetFeatures, 0, 0, b[:]); err != nil {
		return 0, err
	}
	return *(*Flags)(unsafe.Pointer(&b[0])), nil
}

// GetInfo returns a device's info (GET_DEV_INFO).
func GetInfo(ctx context.Context, id int) (DevInfo, error) {
	var info DevInfo
	b := unsafe.Slice((*byte)(unsafe.Pointer(&info)), devInfoSize)
	err := control(ctx, cmdGetDevInfo, uint32(id), 0, b)
	return info, err
}

// Ours reports whether the device was added by this package.
func (i DevInfo) Ours() bool { return i.ServerFlags == serverMark }

// Recoverable reports whether a new server may take the device over.
func (i DevInfo) Recoverable() bool {
	return i.Flags&FlagUserRecovery != 0 && i.State != StateDead
}

// List returns the ids of the ublk devices that exist (every /dev/ublkcN the kernel knows,
// from /sys/class/ublk-char), in order.
func List() ([]int, error) {
	ents, err := os.ReadDir("/sys/class/ublk-char")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ublk: list devices: %w", err)
	}
	var ids []int
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), "ublkc"); ok {
			if id, err := strconv.Atoi(n); err == nil {
				ids = append(ids, id)
			}
		}
	}
	sort.Ints(ids)
	return ids, nil
}

// Delete stops a device (its block device goes away; queued I/O fails) and removes it. A
// device that does not exist is not an error. It is how a restarted node plugin removes an
// orphan; a device served by this process is removed with Device.Delete.
func Delete(ctx context.Context, id int) error {
	err := control(ctx, cmdStopDev, uint32(id), 0, nil)
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	if err != nil {
		return err
	}
	return delDev(ctx, id)
}

func delDev(ctx context.Context, id int) error {
	err := control(ctx, cmdDelDev, uint32(id), 0, nil)
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}

// CharPath is the server side of device id.
func CharPath(id int) string { return "/dev/ublkc" + strconv.Itoa(id) }

// BlockPath is the block device of device id.
func BlockPath(id int) string { return "/dev/ublkb" + strconv.Itoa(id) }

// waitPath waits for a device node: devtmpfs creates it shortly after the kernel adds the
// device.
func waitPath(ctx context.Context, p string) error {
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ublk: %s did not appear: %w", filepath.Base(p), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
