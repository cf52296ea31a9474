package sockfile

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Listener is a unix socket listener on a file this process made; Remove deletes the file
// unless another process has replaced it since.
type Listener struct {
	*net.UnixListener
	path string
	own  os.FileInfo
}

// afterStat runs in Remove between the stat of the file and its removal (tests only).
var afterStat func()

// Listen replaces the file at path (a stale socket, or a predecessor's that still serves:
// new connections reach this process from then on) with a socket listening there. Closing
// the listener leaves the file; Remove deletes it.
func Listen(path string) (*Listener, error) {
	unlock, err := lock(path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the socket left at %s: %w", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	own, err := os.Stat(path)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return &Listener{UnixListener: ln, path: path, own: own}, nil
}

// Path is the socket file's path.
func (l *Listener) Path() string { return l.path }

// Remove deletes the socket file if it is still the one Listen made. It reports what failed;
// a file replaced by another process, or gone, is no failure.
func (l *Listener) Remove() error {
	unlock, err := lock(l.path)
	if err != nil {
		return err
	}
	defer unlock()
	fi, err := os.Stat(l.path)
	if err != nil || !os.SameFile(fi, l.own) {
		return nil
	}
	if afterStat != nil {
		afterStat()
	}
	if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the socket %s: %w", l.path, err)
	}
	return nil
}

// lock takes the exclusive lock of the socket at path and returns its release.
func lock(path string) (func(), error) {
	lp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".lock")
	f, err := os.OpenFile(lp, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the socket's lock file: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", lp, err)
	}
	return func() { _ = f.Close() }, nil // closing the descriptor releases the lock
}
