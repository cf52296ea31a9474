package attach

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// IOStats returns the request counters of every attached volume (NBD; ublk's requests and
// bytes in the same form), by volume ID (the
// metrics.IOSource of the node plugin). A volume detached since has no entry: its counters
// end with its server.
func (a *PoolAttacher) IOStats() map[string]nbd.Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]nbd.Stats, len(a.vols))
	for id, v := range a.vols {
		if v.ub != nil {
			// Request and byte counts of a ublk device (no latency histogram).
			u := v.ub.Stats()
			var st nbd.Stats
			st.Read.Requests, st.Read.Bytes = u.Reads, u.BytesRead
			st.Write.Requests, st.Write.Bytes = u.Writes, u.BytesWritten
			st.Flush.Requests, st.Trim.Requests = u.Flushes, u.Discards
			out[id] = st
			continue
		}
		st, err := v.srv.Stats("")
		if err != nil {
			klog.ErrorS(err, "NBD request counters", "volumeID", id)
			continue
		}
		out[id] = st
	}
	return out
}
