package driver

import (
	"fmt"
	"sync"
)

// VolumeLocks serialises operations per volume ID. It never blocks: a second TryAcquire of a
// held ID fails, and the caller answers Aborted (the CSI spec's "operation pending for
// volume"). The zero value is ready to use.
type VolumeLocks struct {
	mu   sync.Mutex          // guards held
	held map[string]struct{} // IDs with an operation in flight
}

// TryAcquire takes the lock of id, or returns an error wrapping ErrOperationInFlight. A
// successful TryAcquire must be paired with Release(id).
func (l *VolumeLocks) TryAcquire(id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = make(map[string]struct{})
	}
	if _, ok := l.held[id]; ok {
		return fmt.Errorf("volume %q: %w", id, ErrOperationInFlight)
	}
	l.held[id] = struct{}{}
	return nil
}

// Release frees the lock of id.
func (l *VolumeLocks) Release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, id)
}
