package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/raid10-csi/raid10-csi/internal/atomicfile"
)

// stateVersion is the version of the state file format; a file of another version is
// refused rather than guessed at.
const stateVersion = 1

// Record is what the state file keeps about one attached volume.
type Record struct {
	// Index of /dev/nbdX.
	Index uint32 `json:"index"`
	// BackendID given to the kernel at CONNECT.
	BackendID string `json:"backendID"`
	// Export served on the device's connections.
	Export string `json:"export"`
}

type stateFile struct {
	Version int               `json:"version"`
	Devices map[string]Record `json:"devices"`
}

// State is the device-to-volume map persisted in a small JSON file, so that a restarted
// process finds the devices it attached. It also keeps the process's owner file (owner.go) in
// OwnersDir beside the state file.
type State struct {
	path  string
	mu    sync.Mutex
	recs  map[string]Record
	owner *owner // acquired by the first connecting call
}

// OpenState loads the state file at path (a missing file is an empty state).
func OpenState(path string) (*State, error) {
	s := &State{path: path, recs: map[string]Record{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kernel: read state: %w", err)
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("kernel: parse state %s: %w", path, err)
	}
	if f.Version != stateVersion {
		return nil, fmt.Errorf("kernel: state %s has version %d, want %d", path, f.Version, stateVersion)
	}
	if f.Devices != nil {
		s.recs = f.Devices
	}
	return s, nil
}

// connecting lists volumeID among the volumes this process is connecting, in its owner file
// (owner.go), created and locked on the first call and held until the process ends. Attach
// calls it before NBD_CMD_CONNECT and the returned function once the device is recorded:
// Reclaim in another process then knows that an unrecorded device of the volume has a live
// connector, whatever PID namespace either runs in.
func (s *State) connecting(volumeID string) (func(), error) {
	s.mu.Lock()
	if s.owner == nil {
		o, err := acquireOwner(s.ownersDir())
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.owner = o
	}
	o := s.owner
	s.mu.Unlock()
	return o.begin(volumeID)
}

// ownersDir is the directory of owner files, beside the state file.
func (s *State) ownersDir() string { return filepath.Join(filepath.Dir(s.path), OwnersDir) }

// Get returns the record of a volume.
func (s *State) Get(volumeID string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[volumeID]
	return r, ok
}

// Volumes lists the volumes recorded.
func (s *State) Volumes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.recs))
	for v := range s.recs {
		out = append(out, v)
	}
	return out
}

// Put records a volume and writes the file.
func (s *State) Put(volumeID string, r Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.recs[volumeID]
	s.recs[volumeID] = r
	if err := s.writeLocked(); err != nil {
		if had {
			s.recs[volumeID] = old
		} else {
			delete(s.recs, volumeID)
		}
		return err
	}
	return nil
}

// Delete forgets a volume and writes the file. Deleting a missing volume is no error.
func (s *State) Delete(volumeID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.recs[volumeID]
	if !had {
		return nil
	}
	delete(s.recs, volumeID)
	if err := s.writeLocked(); err != nil {
		s.recs[volumeID] = old
		return err
	}
	return nil
}

// writeLocked replaces the file atomically (atomicfile.Write): a crash leaves the old or the
// new file, never a torn one.
func (s *State) writeLocked() error {
	b, err := json.MarshalIndent(stateFile{Version: stateVersion, Devices: s.recs}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path, b)
}
