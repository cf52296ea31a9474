package deploy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestPoolScrubSchedule: node.pool.scrub reaches pool.json as the pool reads it (monthly
// by default, as md), and the schema refuses what the pool would refuse.
func TestPoolScrubSchedule(t *testing.T) {
	bin := helmBinary(t)
	for _, tc := range []struct {
		name string
		set  []string
		want pool.ScrubConfig
	}{
		{"Default", nil, pool.ScrubConfig{Schedule: pool.ScrubMonthly, Start: "01:00", Window: pool.Duration(6 * time.Hour)}},
		{"Weekly", []string{"--set", "node.pool.scrub.schedule=weekly", "--set", "node.pool.scrub.window=2h30m",
			"--set-string", "node.pool.scrub.start=23:15", "--set", "node.pool.scrub.repair=true"},
			pool.ScrubConfig{Schedule: pool.ScrubWeekly, Start: "23:15", Window: pool.Duration(150 * time.Minute), Repair: true}},
		{"Off", []string{"--set", "node.pool.scrub.schedule=off"}, pool.ScrubConfig{Schedule: pool.ScrubOff, Start: "01:00", Window: pool.Duration(6 * time.Hour)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := poolConfig(t, renderChart(t, bin, tc.set...)).Scrub; got != tc.want {
				t.Fatalf("scrub %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		set  []string
		want string
	}{
		{"Schedule", []string{"--set", "node.pool.scrub.schedule=daily"}, "/node/pool/scrub/schedule"},
		{"Start", []string{"--set-string", "node.pool.scrub.start=25:00"}, "/node/pool/scrub/start"},
		{"Window", []string{"--set", "node.pool.scrub.window=a while"}, "/node/pool/scrub/window"},
		{"Unknown", []string{"--set", "node.pool.scrub.rate=1"}, "/node/pool/scrub"},
	} {
		t.Run("Refuses"+tc.name, func(t *testing.T) {
			args := append([]string{"template", "raid10-csi", chartDir, "--kube-version", kubeVersion}, tc.set...)
			_, stderr, err := helm(t, bin, args...)
			if err == nil || !strings.Contains(stderr, "at '"+tc.want) {
				t.Fatalf("helm template %v: %v, want the schema to name %s:\n%s", tc.set, err, tc.want, stderr)
			}
		})
	}
}
