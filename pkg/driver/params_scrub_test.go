package driver

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestParseScrub: the one scrub schedule parser, through its callers: StorageClass
// parameters (parseParams) and mutable parameters merged over a volume's schedule
// (parseMutableScrub, with parseMutableParams validating every key as CreateVolume and
// ControllerModifyVolume do).
func TestParseScrub(t *testing.T) {
	cur := &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Start: "02:30", Window: "4h", Repair: true}
	for _, tc := range []struct {
		name string
		in   map[string]string
		cur  *v1alpha1.VolumeScrubSchedule
		want *v1alpha1.VolumeScrubSchedule
		bad  string // the key the error must name
	}{
		{name: "Every key", in: map[string]string{ParamScrubSchedule: "weekly", ParamScrubStart: "02:30", ParamScrubWindow: "4h", ParamScrubRepair: "true"},
			want: cur},
		{name: "Schedule alone", in: map[string]string{ParamScrubSchedule: "monthly"},
			want: &v1alpha1.VolumeScrubSchedule{Schedule: "monthly"}},
		{name: "Off", in: map[string]string{ParamScrubSchedule: "off"}, want: &v1alpha1.VolumeScrubSchedule{Schedule: "off"}},
		{name: "Omission keeps", in: map[string]string{ParamScrubStart: "23:00"}, cur: cur,
			want: &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Start: "23:00", Window: "4h", Repair: true}},
		{name: "Other keys keep", in: map[string]string{ParamMaxReadIOPS: "10", ParamScrubRateMax: "1Mi"}, cur: cur, want: cur},
		{name: "Repair off", in: map[string]string{ParamScrubRepair: "false"}, cur: cur,
			want: &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Start: "02:30", Window: "4h"}},
		{name: "Node returns to the node's", in: map[string]string{ParamScrubSchedule: "node"}, cur: cur},
		{name: "Node with another key", in: map[string]string{ParamScrubSchedule: "node", ParamScrubWindow: "1h"}, cur: cur, bad: ParamScrubWindow},
		{name: "Start needs a schedule", in: map[string]string{ParamScrubStart: "03:00"}, bad: ParamScrubStart},
		{name: "Bad schedule", in: map[string]string{ParamScrubSchedule: "daily"}, bad: ParamScrubSchedule},
		{name: "Bad start", in: map[string]string{ParamScrubSchedule: "weekly", ParamScrubStart: "25:00"}, bad: ParamScrubStart},
		{name: "Start without minutes", in: map[string]string{ParamScrubSchedule: "weekly", ParamScrubStart: "1:00"}, bad: ParamScrubStart},
		{name: "Window too long", in: map[string]string{ParamScrubSchedule: "weekly", ParamScrubWindow: "25h"}, bad: ParamScrubWindow},
		{name: "Window zero", in: map[string]string{ParamScrubSchedule: "weekly", ParamScrubWindow: "0s"}, bad: ParamScrubWindow},
		{name: "Bad repair", in: map[string]string{ParamScrubSchedule: "weekly", ParamScrubRepair: "yes"}, bad: ParamScrubRepair},
		{name: "Unknown", in: map[string]string{ParamScrubSchedule: "weekly", "scrubInterval": "168h"}, bad: "scrubInterval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cur.DeepCopy()
			_, err := parseMutableParams(tc.in, nil)
			var got *v1alpha1.VolumeScrubSchedule
			if err == nil {
				got, err = parseMutableScrub(tc.in, tc.cur)
			}
			if tc.bad != "" {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.bad)
				}
			} else if err != nil || !equality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("parseMutableScrub = %+v, %v; want %+v", got, err, tc.want)
			}
			if !equality.Semantic.DeepEqual(before, tc.cur) {
				t.Fatalf("cur changed to %+v", tc.cur)
			}
			if tc.cur != nil {
				return
			}
			// The same keys as StorageClass parameters: the same values, the same errors.
			p, err := parseParams(tc.in)
			if tc.bad != "" {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("parseParams err = %v, want InvalidArgument naming %s", err, tc.bad)
				}
				return
			}
			if err != nil || !equality.Semantic.DeepEqual(p.scrub, tc.want) {
				t.Fatalf("parseParams scrub = %+v, %v; want %+v", p.scrub, err, tc.want)
			}
		})
	}
	if _, err := parseParams(map[string]string{"scrub": "weekly"}); err == nil || !strings.Contains(err.Error(), ParamScrubSchedule) {
		t.Fatalf("an unknown StorageClass key's error does not list the scrub keys: %v", err)
	}
	if _, err := parseMutableParams(map[string]string{"scrub": "weekly"}, nil); err == nil || !strings.Contains(err.Error(), ParamScrubSchedule) {
		t.Fatalf("an unknown mutable key's error does not list the scrub keys: %v", err)
	}
}
