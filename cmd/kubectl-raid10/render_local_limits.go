package main

// Rendering of a pool volume's QoS limits in local mode (pool.VolumeInfo.Limits and
// .Throttle, the engine's view): the LIMITS column of volumes and the throttle lines under
// the table.

import (
	"fmt"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// localLimitsColumn is the LIMITS column of a pool volume: the rates in force in short,
// "r:2000iops/200MiB/s,w:1000iops", as the cluster mode's column; "-" for none.
func localLimitsColumn(l *raid10.Limits) string {
	if l == nil {
		return "-"
	}
	return dash(limitsText(l.ReadIOPS, l.ReadBytesPerSecond, l.WriteIOPS, l.WriteBytesPerSecond))
}

// throttleLine says what a volume's limits delayed, "" when nothing was:
// "throttled: reads 12 (1.2s, 48MiB), writes 3 (40ms, 12KiB)".
func throttleLine(v pool.VolumeInfo) string {
	th := v.Throttle
	if th == nil || th.ReadsDelayed == 0 && th.WritesDelayed == 0 {
		return ""
	}
	return fmt.Sprintf("throttled: reads %d (%s, %s), writes %d (%s, %s)",
		th.ReadsDelayed, th.ReadDelay.Round(1e6), human(th.ReadBytesDelayed),
		th.WritesDelayed, th.WriteDelay.Round(1e6), human(th.WriteBytesDelayed))
}
