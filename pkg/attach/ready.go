package attach

import (
	"fmt"
	"sort"
	"time"
)

// readyGrace is how long an attached device may have no connection served (right after its
// attach, or while a connection is replaced) before Ready reports it.
const readyGrace = 5 * time.Second

// Ready is the node plugin's readiness check (the metrics server's /readyz): nil when every
// volume attached by this process over NBD has a connection of its /dev/nbdX served, or had one less
// than readyGrace ago; else an error naming the volumes and devices without. Such a device
// fails every request above it until a NodeStageVolume retry or a restart reattaches it.
func (a *PoolAttacher) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var dead []string
	for id, s := range a.vols {
		if s.ub != nil {
			continue // no connection: its queue threads serve it from Create or Recover on
		}
		if u := s.dev.Unserved(); u >= readyGrace {
			dead = append(dead, fmt.Sprintf("%s on %s for %s", id, s.dev.Path(), u.Round(time.Second)))
		}
	}
	if len(dead) > 0 {
		sort.Strings(dead)
		return fmt.Errorf("attached volumes without a served NBD connection: %v", dead)
	}
	return nil
}
