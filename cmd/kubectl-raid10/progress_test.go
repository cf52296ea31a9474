package main

import (
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

func TestProgressBar(t *testing.T) {
	eta := func(s int64) *int64 { return &s }
	for _, tc := range []struct {
		name string
		p    *v1alpha1.RebuildProgress
		want string
	}{
		{"None", nil, "-"},
		{"Start", &v1alpha1.RebuildProgress{Percent: 0, ETASeconds: eta(3600)}, "[..........] 0% ETA 1h0m0s"},
		{"Half", &v1alpha1.RebuildProgress{Percent: 52, ETASeconds: eta(70)}, "[#####.....] 52% ETA 1m10s"},
		{"NoRateYet", &v1alpha1.RebuildProgress{Percent: 9}, "[..........] 9% ETA -"},
		{"Done", &v1alpha1.RebuildProgress{Percent: 100, ETASeconds: eta(0)}, "[##########] 100% ETA 0s"},
		{"OutOfRange", &v1alpha1.RebuildProgress{Percent: 140}, "[##########] 100% ETA -"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := progressBar(tc.p); got != tc.want {
				t.Fatalf("progressBar(%+v) = %q, want %q", tc.p, got, tc.want)
			}
		})
	}
}

func TestCopyBar(t *testing.T) {
	for _, tc := range []struct {
		ready bool
		pct   int32
		want  string
	}{
		{false, 0, "[..........] 0%"},
		{false, 47, "[####......] 47%"},
		{true, 100, "ready"},
	} {
		if got := copyBar(tc.ready, tc.pct); got != tc.want {
			t.Errorf("copyBar(%v, %d) = %q, want %q", tc.ready, tc.pct, got, tc.want)
		}
	}
}
