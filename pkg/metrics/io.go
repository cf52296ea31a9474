package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// IOSource gives the request counters of the volumes served over NBD, by volume name, at
// scrape time. The node plugin's attacher implements it.
type IOSource interface {
	IOStats() map[string]nbd.Stats
}

// IOCollector exports the NBD request counters of every served volume: requests, errors
// and bytes by operation, and a latency histogram by operation. The counters are the
// server's own, kept per connection under its write lock: scraping adds nothing to the I/O
// path.
type IOCollector struct {
	src IOSource
}

var _ prometheus.Collector = (*IOCollector)(nil)

// NewIOCollector returns a collector for src.
func NewIOCollector(src IOSource) *IOCollector { return &IOCollector{src: src} }

var (
	ioRequests = desc("volume_requests_total", "NBD requests of the volume answered, by operation (read, write, flush, trim, write_zeroes).", "volume", "op")
	ioErrors   = desc("volume_request_errors_total", "NBD requests of the volume answered with an error, by operation.", "volume", "op")
	ioBytes    = desc("volume_request_bytes_total", "Bytes of the volume's successful NBD requests, by operation (trim and write_zeroes: the range).", "volume", "op")
	ioLatency  = desc("volume_request_duration_seconds", "Time from reading an NBD request of the volume to writing its reply, by operation.", "volume", "op")
)

// latencyBounds are nbd.LatencyBounds in seconds, the histogram's upper bounds.
var latencyBounds = func() []float64 {
	b := make([]float64, len(nbd.LatencyBounds))
	for i, d := range nbd.LatencyBounds {
		b[i] = d.Seconds()
	}
	return b
}()

// Describe implements prometheus.Collector.
func (c *IOCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ioRequests, ioErrors, ioBytes, ioLatency} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *IOCollector) Collect(ch chan<- prometheus.Metric) {
	for vol, st := range c.src.IOStats() {
		for _, op := range []struct {
			name string
			o    *nbd.OpStats
		}{{"read", &st.Read}, {"write", &st.Write}, {"flush", &st.Flush}, {"trim", &st.Trim}, {"write_zeroes", &st.WriteZeroes}} {
			ch <- prometheus.MustNewConstMetric(ioRequests, prometheus.CounterValue, float64(op.o.Requests), vol, op.name)
			ch <- prometheus.MustNewConstMetric(ioErrors, prometheus.CounterValue, float64(op.o.Errors), vol, op.name)
			ch <- prometheus.MustNewConstMetric(ioBytes, prometheus.CounterValue, float64(op.o.Bytes), vol, op.name)
			buckets := make(map[float64]uint64, len(latencyBounds))
			var cum uint64
			for i, le := range latencyBounds {
				cum += op.o.Latency[i]
				buckets[le] = cum
			}
			ch <- prometheus.MustNewConstHistogram(ioLatency, op.o.Requests, op.o.LatencySum.Seconds(), buckets, vol, op.name)
		}
	}
}
