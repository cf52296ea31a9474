package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestDescribeSchedule: describe volume shows the volume's rates and scrub schedule under
// Spec (the node's when it has none, the pool's defaults for fields left empty) and, under
// Status, "applied" or what the node agent last applied while the spec is pending.
func TestDescribeSchedule(t *testing.T) {
	own := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Rates:         &v1alpha1.VolumeRates{RebuildRateMax: 50 << 20},
		ScrubSchedule: &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Start: "02:30", Repair: true},
	}}
	own.Status.Rates = own.Spec.Rates.DeepCopy()
	for _, tc := range []struct {
		name string
		v    *v1alpha1.Raid10Volume
		want []string
	}{
		{"node's", &v1alpha1.Raid10Volume{}, []string{
			"  Rates:       the node's\n", "  Scrub plan:  the node's\n", "  Rates:       applied\n", "  Scrub plan:  applied\n"}},
		{"own, schedule pending", own, []string{
			"  Rates:       rebuild max 50MiB/s (others the node's)\n",
			"  Scrub plan:  weekly repair, nightly from 02:30 for 6h\n",
			"  Rates:       applied\n",
			"  Scrub plan:  the node's (spec not applied yet: the node agent puts it on the pool once assembled)\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			ew := &errWriter{w: &b}
			describeSpec(ew, tc.v, time.Now())
			describeStatus(ew, tc.v, time.Now())
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("describe:\n%s\nwant the line %q", b.String(), w)
				}
			}
		})
	}
	if got := scrubScheduleDetail(&v1alpha1.VolumeScrubSchedule{Schedule: "off"}); !strings.HasPrefix(got, "off") {
		t.Errorf("off schedule: %q", got)
	}
}
