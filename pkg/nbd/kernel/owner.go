package kernel

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/internal/atomicfile"
)

// Owner files tell Reclaim whether the process that connected a device still lives, in any
// PID namespace. Every process that connects devices holds an exclusive flock on a file of its
// own in OwnersDir beside the state file, named by a random token; before each NBD_CMD_CONNECT
// it lists the volume in "<token>.connecting" beside it, and takes the volume off once the
// device is recorded in the state file. The kernel drops a flock when the last descriptor of
// the open file closes, at the latest when the process has exited (a thread stuck in a system
// call, in a hung disk, holds it until it returns), and a lock on the same inode is seen by
// every process, in every PID namespace and container, that shares the directory (a hostPath
// in a cluster). An unrecorded device of a volume that an owner lists is alive while one such
// owner's lock is held. /sys/block/nbdX/pid names a PID of the host's PID namespace, which a
// pod without hostPID cannot ask about; it serves only devices that no owner lists (connected
// by a version before owner files), and only in the host's PID namespace.
//
// The backend identifier stays "raid10-csi:<volume>": a device keeps the identifier it was
// connected with (the kernel refuses a RECONFIGURE naming another), so an identifier that
// carried the token would make every device connected by this version unusable to the version
// before it, after a rollback.

// OwnersDir is the directory of owner files, beside the state file.
const OwnersDir = "owners"

const (
	tokenBytes       = 16
	connectingSuffix = ".connecting"
)

// owner is this process's owner file, locked for as long as the process lives (or until
// release), with the volumes it is connecting.
type owner struct {
	dir   string
	token string
	f     *os.File

	mu         sync.Mutex
	connecting map[string]int // volume -> connects in progress
}

// heldOwners keeps every owner reachable: a State dropped by its user must not let the
// garbage collector close the file (os.File's finalizer), which would release the lock while
// a device it is connecting is still unrecorded.
var heldOwners struct {
	sync.Mutex
	m map[*owner]bool
}

// acquireOwner creates an owner file with a fresh token in dir (created if missing, but not
// its parent) and locks it.
func acquireOwner(dir string) (*owner, error) {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("kernel: owner directory: %w", err)
	}
	var last error
	for range 3 {
		o, err := tryOwner(dir)
		if err == nil {
			heldOwners.Lock()
			defer heldOwners.Unlock()
			if heldOwners.m == nil {
				heldOwners.m = map[*owner]bool{}
			}
			heldOwners.m[o] = true
			return o, nil
		}
		last = err
	}
	return nil, fmt.Errorf("kernel: acquire an owner file in %s: %w", dir, last)
}

// tryOwner makes one attempt. A Reclaim in another process may take a file between its
// creation and its lock, as a dead owner's, and remove it: the lock then fails, or holds an
// unlinked inode, and the caller tries again with a new token.
func tryOwner(dir string) (*owner, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	tok := hex.EncodeToString(b)
	path := filepath.Join(dir, tok)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	held, err1 := f.Stat()
	named, err2 := os.Stat(path)
	if err := errors.Join(err1, err2); err != nil || !os.SameFile(held, named) {
		_ = f.Close()
		return nil, fmt.Errorf("owner file %s was removed before it was locked: %w", path, err)
	}
	// For a person looking: the PID in this process's own namespace.
	_, _ = f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	return &owner{dir: dir, token: tok, f: f, connecting: map[string]int{}}, nil
}

// release unlocks the owner file, as the process's death would. The files stay: a later
// Reclaim removes them.
func (o *owner) release() error {
	heldOwners.Lock()
	delete(heldOwners.m, o)
	heldOwners.Unlock()
	return o.f.Close()
}

// intent is the content of an owner's connecting file.
type intent struct {
	Connecting []string `json:"connecting"`
}

// begin lists volumeID as being connected by this owner, durably, before the CONNECT; the
// returned function takes it off again, once the device is recorded (or was not connected).
func (o *owner) begin(volumeID string) (func(), error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.connecting[volumeID]++
	if err := o.writeLocked(); err != nil {
		o.dropLocked(volumeID)
		return nil, err
	}
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.dropLocked(volumeID)
		// A failure leaves the volume listed: while this process lives its unrecorded
		// devices of that volume stay alive to Reclaim, which is what they are.
		if err := o.writeLocked(); err != nil {
			klog.ErrorS(err, "Updating the owner's list of volumes being connected", "volumeID", volumeID)
		}
	}, nil
}

func (o *owner) dropLocked(volumeID string) {
	if o.connecting[volumeID]--; o.connecting[volumeID] <= 0 {
		delete(o.connecting, volumeID)
	}
}

func (o *owner) writeLocked() error {
	path := filepath.Join(o.dir, o.token+connectingSuffix)
	if len(o.connecting) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kernel: owner's connecting file: %w", err)
		}
		return nil
	}
	var in intent
	for v := range o.connecting {
		in.Connecting = append(in.Connecting, v)
	}
	slices.Sort(in.Connecting)
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b); err != nil {
		return fmt.Errorf("kernel: owner's connecting file: %w", err)
	}
	return nil
}

// isToken reports whether s has the form of an owner token.
func isToken(s string) bool {
	if len(s) != 2*tokenBytes {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ownerScan is what scanOwners found: which owners live, which died, and which volumes each
// was connecting. It holds the lock of every dead owner's file until release, so a concurrent
// scan sees those owners as alive and removes nothing under it.
type ownerScan struct {
	dir        string
	alive      map[string]bool
	dead       map[string]*os.File
	connecting map[string][]string // volume -> owners connecting it
}

// scanOwners tries to lock every owner file in dir (a lock it gets is a dead owner's) and
// reads the owners' connecting files. A missing directory is an empty scan. An owner file it
// cannot open or lock counts as alive, with the error returned.
func scanOwners(dir string) (*ownerScan, error) {
	s := &ownerScan{dir: dir, alive: map[string]bool{}, dead: map[string]*os.File{}, connecting: map[string][]string{}}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kernel: read owner directory: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !isToken(e.Name()) {
			continue
		}
		if err := s.judge(e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, e := range ents {
		tok, ok := strings.CutSuffix(e.Name(), connectingSuffix)
		if !ok || !isToken(tok) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // its owner finished its connects
		}
		var in intent
		if err == nil {
			err = json.Unmarshal(b, &in)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("kernel: owner's connecting file %s: %w", e.Name(), err))
			continue
		}
		if !s.alive[tok] && s.dead[tok] == nil {
			s.alive[tok] = true // an owner that came after the listing: it lives
		}
		for _, v := range in.Connecting {
			s.connecting[v] = append(s.connecting[v], tok)
		}
	}
	return s, errors.Join(errs...)
}

// judge tries to lock the owner file of tok.
func (s *ownerScan) judge(tok string) error {
	f, err := os.Open(filepath.Join(s.dir, tok))
	if errors.Is(err, os.ErrNotExist) {
		return nil // removed by a concurrent scan
	}
	if err != nil {
		s.alive[tok] = true // cannot be told: never judged dead
		return fmt.Errorf("kernel: open owner file: %w", err)
	}
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		s.dead[tok] = f
		return nil
	case errors.Is(err, unix.EWOULDBLOCK):
		s.alive[tok] = true
		_ = f.Close()
		return nil
	default:
		s.alive[tok] = true
		_ = f.Close()
		return fmt.Errorf("kernel: lock owner file %s: %w", tok, err)
	}
}

// Liveness of the process that connected a device.
type liveness int

const (
	connectorUnlisted liveness = iota // no owner lists the volume
	connectorAlive                    // an owner that lists it lives
	connectorDead                     // every owner that lists it died
)

// of reports the liveness of the connector of an unrecorded device of volumeID.
func (s *ownerScan) of(volumeID string) liveness {
	toks := s.connecting[volumeID]
	if len(toks) == 0 {
		return connectorUnlisted
	}
	for _, t := range toks {
		if s.dead[t] == nil {
			return connectorAlive
		}
	}
	return connectorDead
}

// removeDead removes the files of every dead owner. The caller has dealt with every device
// such an owner was connecting (recorded or disconnected it).
func (s *ownerScan) removeDead() {
	for tok := range s.dead {
		for _, name := range []string{tok + connectingSuffix, tok} {
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				klog.ErrorS(err, "Removing a dead owner's file", "file", name)
			}
		}
	}
}

// release unlocks the dead owners' files.
func (s *ownerScan) release() {
	for _, f := range s.dead {
		_ = f.Close()
	}
}
