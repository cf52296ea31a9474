package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// The QoS limits in force on a volume's array (raid10.Array.SetLimits, put there from the
// Raid10Volume's spec.limits by the node agent) and what they delayed. A limit's gauges are
// absent while that limit is unset (unlimited), so that usage / limit in PromQL only ever
// divides by a real limit; the throttle counters are always there, 0 until a request waits.
var (
	volLimitOps     = desc("volume_limit_ops_per_second", "QoS limit in force on the volume's requests per second, by direction; absent when unlimited.", "volume", "op")
	volLimitBytes   = desc("volume_limit_bytes_per_second", "QoS limit in force on the volume's bytes per second, by direction; absent when unlimited.", "volume", "op")
	volLimitOpsBst  = desc("volume_limit_burst_ops", "Requests the volume's QoS limit lets through at once after an idle time (its burst, the default share of the rate when none was set); absent when unlimited.", "volume", "op")
	volLimitBytesBs = desc("volume_limit_burst_bytes", "Bytes the volume's QoS limit lets through at once after an idle time (its burst, the default share of the rate when none was set); absent when unlimited.", "volume", "op")
	volThrottled    = desc("volume_throttled_requests_total", "Requests from the volume's block device that waited for its QoS limits, by direction.", "volume", "op")
	volThrottleWait = desc("volume_throttle_wait_seconds_total", "Time the volume's requests waited for its QoS limits, summed over the requests, by direction.", "volume", "op")
	volThrottledB   = desc("volume_throttled_bytes_total", "Bytes moved by the volume's requests that waited for its QoS limits, by direction (a discard or write-zeroes moves none).", "volume", "op")
)

// limitDescs are the descriptions collectLimits reports, for Describe.
var limitDescs = []*prometheus.Desc{volLimitOps, volLimitBytes, volLimitOpsBst, volLimitBytesBs, volThrottled, volThrottleWait, volThrottledB}

// collectLimits reports volume name's limits and throttle counters from its array's status.
func collectLimits(ch chan<- prometheus.Metric, name string, as raid10.Status) {
	l, th := as.Limits, as.Throttle
	for _, d := range []struct {
		op                               string
		ops, opsBurst, bytes, bytesBurst int64
		delayed, delayedBytes            uint64
		waited                           float64
	}{
		{"read", l.ReadIOPS, l.ReadIOPSBurst, l.ReadBytesPerSecond, l.ReadBytesBurst, th.ReadsDelayed, th.ReadBytesDelayed, th.ReadDelay.Seconds()},
		{"write", l.WriteIOPS, l.WriteIOPSBurst, l.WriteBytesPerSecond, l.WriteBytesBurst, th.WritesDelayed, th.WriteBytesDelayed, th.WriteDelay.Seconds()},
	} {
		if d.ops > 0 {
			ch <- prometheus.MustNewConstMetric(volLimitOps, prometheus.GaugeValue, float64(d.ops), name, d.op)
			ch <- prometheus.MustNewConstMetric(volLimitOpsBst, prometheus.GaugeValue, float64(d.opsBurst), name, d.op)
		}
		if d.bytes > 0 {
			ch <- prometheus.MustNewConstMetric(volLimitBytes, prometheus.GaugeValue, float64(d.bytes), name, d.op)
			ch <- prometheus.MustNewConstMetric(volLimitBytesBs, prometheus.GaugeValue, float64(d.bytesBurst), name, d.op)
		}
		ch <- prometheus.MustNewConstMetric(volThrottled, prometheus.CounterValue, float64(d.delayed), name, d.op)
		ch <- prometheus.MustNewConstMetric(volThrottleWait, prometheus.CounterValue, d.waited, name, d.op)
		ch <- prometheus.MustNewConstMetric(volThrottledB, prometheus.CounterValue, float64(d.delayedBytes), name, d.op)
	}
}
