package main

// Rendering of a volume's background settings: its rebuild and scrub rates (spec.rates) and
// its scrub schedule (spec.scrubSchedule, and status.scrubSchedule as the node agent applied
// it), describe volume's lines beside the QoS limits.

import (
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// ratesDetail is describe's text of rates r: each rate set, "the node's" for none.
func ratesDetail(r *v1alpha1.VolumeRates) string {
	if r == nil || *r == (v1alpha1.VolumeRates{}) {
		return "the node's"
	}
	var parts []string
	for _, f := range []struct {
		name string
		n    int64
	}{{"rebuild min", r.RebuildRateMin}, {"rebuild max", r.RebuildRateMax}, {"scrub max", r.ScrubRateMax}} {
		if f.n > 0 {
			parts = append(parts, f.name+" "+human(uint64(f.n))+"/s")
		}
	}
	return strings.Join(parts, ", ") + " (others the node's)"
}

// scrubScheduleDetail is describe's text of schedule s, with the pool's defaults for the
// fields left empty: "weekly repair, nightly from 02:00 for 4h", "off", or "the node's".
func scrubScheduleDetail(s *v1alpha1.VolumeScrubSchedule) string {
	switch {
	case s == nil:
		return "the node's"
	case s.Schedule == pool.ScrubOff:
		return "off (no scheduled scrub of this volume)"
	}
	start, window, kind := s.Start, s.Window, "check"
	if start == "" {
		start = pool.DefaultScrubStart
	}
	if window == "" {
		window = strings.TrimSuffix(strings.TrimSuffix(pool.DefaultScrubWindow.String(), "0s"), "0m")
	}
	if s.Repair {
		kind = "repair"
	}
	return s.Schedule + " " + kind + ", nightly from " + start + " for " + window
}

// describeScheduleSpec prints describe's rates and scrub schedule lines under Spec.
func describeScheduleSpec(ew *errWriter, v *v1alpha1.Raid10Volume) {
	ew.printf("  Rates:       %s\n", ratesDetail(v.Spec.Rates))
	ew.printf("  Scrub plan:  %s\n", scrubScheduleDetail(v.Spec.ScrubSchedule))
}

// describeScheduleStatus prints describe's status of the rates and the scrub schedule:
// "applied", or what the node agent last applied while the spec is not yet.
func describeScheduleStatus(ew *errWriter, v *v1alpha1.Raid10Volume) {
	const pending = " (spec not applied yet: the node agent puts it on the pool once assembled)"
	if equality.Semantic.DeepEqual(v.Spec.Rates, v.Status.Rates) {
		ew.printf("  Rates:       applied\n")
	} else {
		ew.printf("  Rates:       %s%s\n", ratesDetail(v.Status.Rates), pending)
	}
	if equality.Semantic.DeepEqual(v.Spec.ScrubSchedule, v.Status.ScrubSchedule) {
		ew.printf("  Scrub plan:  applied\n")
	} else {
		ew.printf("  Scrub plan:  %s%s\n", scrubScheduleDetail(v.Status.ScrubSchedule), pending)
	}
}
