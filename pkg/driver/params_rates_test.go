package driver

import (
	"errors"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestParseRates: the one rate parser, through its callers: StorageClass parameters
// (parseParams) and mutable parameters merged over a volume's rates (parseMutableRates, with
// parseMutableParams validating every key as CreateVolume and ControllerModifyVolume do).
func TestParseRates(t *testing.T) {
	cur := &v1alpha1.VolumeRates{RebuildRateMax: 50 << 20, ScrubRateMax: 10 << 20}
	for _, tc := range []struct {
		name string
		in   map[string]string
		cur  *v1alpha1.VolumeRates
		want *v1alpha1.VolumeRates
		bad  string // the key the error must name
	}{
		{name: "Every key", in: map[string]string{ParamRebuildRateMin: "1Mi", ParamRebuildRateMax: "100M", ParamScrubRateMax: "20Mi"},
			want: &v1alpha1.VolumeRates{RebuildRateMin: 1 << 20, RebuildRateMax: 100e6, ScrubRateMax: 20 << 20}},
		{name: "Omission keeps", in: map[string]string{ParamRebuildRateMin: "2Mi"}, cur: cur,
			want: &v1alpha1.VolumeRates{RebuildRateMin: 2 << 20, RebuildRateMax: 50 << 20, ScrubRateMax: 10 << 20}},
		{name: "Limit keys leave rates", in: map[string]string{ParamMaxReadIOPS: "10"}, cur: cur, want: cur},
		{name: "Zero is the node's", in: map[string]string{ParamScrubRateMax: "0"}, cur: cur,
			want: &v1alpha1.VolumeRates{RebuildRateMax: 50 << 20}},
		{name: "All zero is none", in: map[string]string{ParamScrubRateMax: "0", ParamRebuildRateMax: "0"}, cur: cur},
		{name: "Unknown", in: map[string]string{ParamScrubRateMax: "1Mi", "scrubRate": "1Mi"}, bad: `"scrubRate"`},
		{name: "Unknown scrub key", in: map[string]string{"scrubInterval": "168h"}, bad: "scrubInterval"},
		{name: "Garbage", in: map[string]string{ParamRebuildRateMax: "fast"}, bad: ParamRebuildRateMax},
		{name: "Negative", in: map[string]string{ParamRebuildRateMin: "-1Mi"}, bad: ParamRebuildRateMin},
		{name: "Fractional", in: map[string]string{ParamScrubRateMax: "0.5"}, bad: ParamScrubRateMax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cur.DeepCopy()
			_, err := parseMutableParams(tc.in, nil)
			var got *v1alpha1.VolumeRates
			if err == nil {
				got, err = parseMutableRates(tc.in, tc.cur)
			}
			if tc.bad != "" {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.bad)
				}
			} else if err != nil || (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("parseMutableRates = %+v, %v; want %+v", got, err, tc.want)
			}
			if (before == nil) != (tc.cur == nil) || (before != nil && *before != *tc.cur) {
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
			if err != nil || p.rates != *tc.want {
				t.Fatalf("parseParams rates = %+v, %v; want %+v", p.rates, err, tc.want)
			}
		})
	}
	if _, err := parseParams(map[string]string{"maxIOPS": "5"}); err == nil || !strings.Contains(err.Error(), ParamScrubRateMax) {
		t.Fatalf("an unknown StorageClass key's error does not list the rate keys: %v", err)
	}
}
