package driver

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// IOStats returns the NBD request counters of every attached volume, by volume ID (the
// metrics.IOSource of the node plugin). A volume detached since has no entry: its counters
// end with its server.
func (a *PoolAttacher) IOStats() map[string]nbd.Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]nbd.Stats, len(a.vols))
	for id, v := range a.vols {
		st, err := v.srv.Stats("")
		if err != nil {
			klog.ErrorS(err, "NBD request counters", "volumeID", id)
			continue
		}
		out[id] = st
	}
	return out
}
