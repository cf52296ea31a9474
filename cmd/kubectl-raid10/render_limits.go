package main

// Rendering of a volume's QoS limits (spec.limits, and status.limits as the node agent
// applied them): the LIMITS column of volumes and describe volume's lines.

import (
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// limitsPending says whether the node agent has not yet put spec.limits on the array:
// status.limits differs (a change not applied yet, or a volume not assembled since).
func limitsPending(v *v1alpha1.Raid10Volume) bool {
	return !equality.Semantic.DeepEqual(v.Spec.Limits, v.Status.Limits)
}

// limitsColumn is the LIMITS column: spec.limits in short, "r:2000iops/200MiB/s,w:1000iops",
// "-" for none, with " (pending)" while the node agent has not applied them.
func limitsColumn(v *v1alpha1.Raid10Volume) string {
	text := ""
	if l := v.Spec.Limits; l != nil {
		text = limitsText(l.ReadIOPS, l.ReadBytesPerSecond, l.WriteIOPS, l.WriteBytesPerSecond)
	}
	s := dash(text)
	if limitsPending(v) {
		s += " (pending)"
	}
	return s
}

// limitsDetail is describe's text of limits l: each direction's rates with their bursts,
// "unlimited" for a direction without any, "none" for no limits at all.
func limitsDetail(l *v1alpha1.VolumeLimits) string {
	if l == nil || *l == (v1alpha1.VolumeLimits{}) {
		return "none"
	}
	rate := func(n, burst int64, unit string, size func(int64) string) string {
		s := size(n) + " " + unit
		if burst > 0 {
			s += " (burst " + size(burst) + ")"
		}
		return s
	}
	count := func(n int64) string { return strconv.FormatInt(n, 10) }
	bytes := func(n int64) string { return human(uint64(n)) }
	dir := func(name string, iops, iopsBurst, bps, bpsBurst int64) string {
		var parts []string
		if iops > 0 {
			parts = append(parts, rate(iops, iopsBurst, "IOPS", count))
		}
		if bps > 0 {
			parts = append(parts, rate(bps, bpsBurst, "per second", bytes))
		}
		if parts == nil {
			return name + " unlimited"
		}
		return name + " " + strings.Join(parts, ", ")
	}
	return dir("read", l.ReadIOPS, l.ReadIOPSBurst, l.ReadBytesPerSecond, l.ReadBytesBurst) + "; " +
		dir("write", l.WriteIOPS, l.WriteIOPSBurst, l.WriteBytesPerSecond, l.WriteBytesBurst)
}

// describeLimitsSpec prints describe's QoS line under Spec: spec.limits, then the rates and
// the scrub schedule (render_schedule.go).
func describeLimitsSpec(ew *errWriter, v *v1alpha1.Raid10Volume) {
	ew.printf("  QoS limits:  %s\n", limitsDetail(v.Spec.Limits))
	describeScheduleSpec(ew, v)
}

// describeLimitsStatus prints describe's QoS line under Status: "applied" when status.limits
// are the spec's, else what the node agent last applied and that the spec is not yet; then
// the same for the rates and the scrub schedule.
func describeLimitsStatus(ew *errWriter, v *v1alpha1.Raid10Volume) {
	if !limitsPending(v) {
		ew.printf("  QoS limits:  applied\n")
	} else {
		ew.printf("  QoS limits:  %s (spec not applied yet: the node agent puts it on the array once assembled)\n", limitsDetail(v.Status.Limits))
	}
	describeScheduleStatus(ew, v)
}

// limitsText is a volume's read and write limits in short, "r:2000iops/200MiB/s,w:1000iops"
// (a zero is no limit), "" for none: the LIMITS column of both modes.
func limitsText(readIOPS, readBPS, writeIOPS, writeBPS int64) string {
	var dirs []string
	for _, d := range []struct {
		name      string
		iops, bps int64
	}{{"r", readIOPS, readBPS}, {"w", writeIOPS, writeBPS}} {
		var parts []string
		if d.iops > 0 {
			parts = append(parts, strconv.FormatInt(d.iops, 10)+"iops")
		}
		if d.bps > 0 {
			parts = append(parts, human(uint64(d.bps))+"/s")
		}
		if parts != nil {
			dirs = append(dirs, d.name+":"+strings.Join(parts, "/"))
		}
	}
	return strings.Join(dirs, ",")
}
