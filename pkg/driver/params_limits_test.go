package driver

import (
	"errors"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestParseLimits: the one limit parser, through both of its callers: StorageClass
// parameters (parseParams) and mutable parameters merged over a volume's limits
// (parseMutableParams, CreateVolume and ControllerModifyVolume).
func TestParseLimits(t *testing.T) {
	cur := &v1alpha1.VolumeLimits{ReadIOPS: 1000, WriteBytesPerSecond: 100 << 20, WriteBytesBurst: 8 << 20}
	for _, tc := range []struct {
		name string
		in   map[string]string
		cur  *v1alpha1.VolumeLimits
		want *v1alpha1.VolumeLimits
		bad  string // the key the error must name
	}{
		{name: "Every key", in: map[string]string{
			ParamMaxReadIOPS: "100", ParamMaxReadIOPSBurst: "10", ParamMaxWriteIOPS: "200", ParamMaxWriteIOPSBurst: "20",
			ParamMaxReadBytesPerSecond: "10Mi", ParamMaxReadBytesBurst: "1Mi", ParamMaxWriteBytesPerSecond: "20M", ParamMaxWriteBytesBurst: "2048",
		}, want: &v1alpha1.VolumeLimits{
			ReadIOPS: 100, ReadIOPSBurst: 10, WriteIOPS: 200, WriteIOPSBurst: 20,
			ReadBytesPerSecond: 10 << 20, ReadBytesBurst: 1 << 20, WriteBytesPerSecond: 20e6, WriteBytesBurst: 2048,
		}},
		{name: "Omission keeps", in: map[string]string{ParamMaxWriteIOPS: "50"}, cur: cur,
			want: &v1alpha1.VolumeLimits{ReadIOPS: 1000, WriteIOPS: 50, WriteBytesPerSecond: 100 << 20, WriteBytesBurst: 8 << 20}},
		{name: "Nothing keeps all", cur: cur, want: cur},
		{name: "Zero lifts one", in: map[string]string{ParamMaxReadIOPS: "0"}, cur: cur,
			want: &v1alpha1.VolumeLimits{WriteBytesPerSecond: 100 << 20, WriteBytesBurst: 8 << 20}},
		{name: "Zero everywhere is none", in: map[string]string{ParamMaxReadIOPS: "0", ParamMaxWriteBytesPerSecond: "0", ParamMaxWriteBytesBurst: "0"}, cur: cur},
		{name: "Unknown", in: map[string]string{ParamMaxReadIOPS: "5", "maxIOPS": "5"}, cur: cur, bad: `"maxIOPS"`},
		{name: "Layout is not mutable", in: map[string]string{ParamMembers: "6"}, bad: ParamMembers},
		{name: "IOPS not a number", in: map[string]string{ParamMaxWriteIOPS: "fast"}, bad: ParamMaxWriteIOPS},
		{name: "IOPS as a quantity", in: map[string]string{ParamMaxReadIOPS: "1k"}, bad: ParamMaxReadIOPS},
		{name: "IOPS negative", in: map[string]string{ParamMaxReadIOPSBurst: "-1"}, bad: ParamMaxReadIOPSBurst},
		{name: "Bytes garbage", in: map[string]string{ParamMaxReadBytesPerSecond: "lots"}, bad: ParamMaxReadBytesPerSecond},
		{name: "Bytes negative", in: map[string]string{ParamMaxWriteBytesBurst: "-1Mi"}, bad: ParamMaxWriteBytesBurst},
		{name: "Bytes fractional", in: map[string]string{ParamMaxWriteBytesPerSecond: "0.5"}, bad: ParamMaxWriteBytesPerSecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cur.DeepCopy()
			got, err := parseMutableParams(tc.in, tc.cur)
			if tc.bad != "" {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.bad)
				}
			} else if err != nil || (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("parseMutableParams = %+v, %v; want %+v", got, err, tc.want)
			}
			if (before == nil) != (tc.cur == nil) || (before != nil && *before != *tc.cur) {
				t.Fatalf("cur changed to %+v", tc.cur)
			}
			if tc.cur != nil || tc.bad == ParamMembers {
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
			if err != nil || p.limits != *tc.want {
				t.Fatalf("parseParams limits = %+v, %v; want %+v", p.limits, err, tc.want)
			}
		})
	}
}

// TestParseParamsUnknownListsLimitKeys: a StorageClass's unknown key still fails, and the
// message lists the limit keys among the known ones.
func TestParseParamsUnknownListsLimitKeys(t *testing.T) {
	_, err := parseParams(map[string]string{"maxIOPS": "5"})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `"maxIOPS"`) || !strings.Contains(err.Error(), ParamMaxWriteBytesBurst) {
		t.Fatalf("err = %v", err)
	}
}
