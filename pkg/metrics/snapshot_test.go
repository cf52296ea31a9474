package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestPoolCollectorSnapshots: a snapshot's copy progress and readiness, and a restore's
// hydration, as the pool reports them; a volume made blank has no hydration series.
func TestPoolCollectorSnapshots(t *testing.T) {
	cut := time.Unix(1764547200, 500_000_000)
	src := statusSource{pool.Status{Name: "default",
		Volumes: []pool.VolumeInfo{
			{Name: "blank", Health: pool.Healthy, Size: 64 << 20, Hydrated: true},
			{Name: "restore", Health: pool.Healthy, Size: 64 << 20, Source: &pool.Source{Snapshot: "snap-b"}, Copied: 16 << 20},
		},
		Snapshots: []pool.SnapshotInfo{
			{Name: "snap-a", Source: "blank", Size: 64 << 20, Copied: 48 << 20, CutAt: cut, Health: pool.Healthy},
			{Name: "snap-b", Source: "blank", Size: 64 << 20, Copied: 64 << 20, Ready: true, CutAt: cut, Health: pool.Healthy},
		}}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewPoolCollector(src))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP raid10_snapshot_copied_bytes Bytes of a snapshot copied into its own extents; equal to its size once ready.
# TYPE raid10_snapshot_copied_bytes gauge
raid10_snapshot_copied_bytes{snapshot="snap-a",source="blank"} 5.0331648e+07
raid10_snapshot_copied_bytes{snapshot="snap-b",source="blank"} 6.7108864e+07
# HELP raid10_snapshot_cut_timestamp_seconds The point in time a snapshot holds (Unix time of its cut).
# TYPE raid10_snapshot_cut_timestamp_seconds gauge
raid10_snapshot_cut_timestamp_seconds{snapshot="snap-a",source="blank"} 1.7645472005e+09
raid10_snapshot_cut_timestamp_seconds{snapshot="snap-b",source="blank"} 1.7645472005e+09
# HELP raid10_snapshot_ready 1 once the snapshot's copy is complete (ready to use, independent of its source), else 0.
# TYPE raid10_snapshot_ready gauge
raid10_snapshot_ready{snapshot="snap-a",source="blank"} 0
raid10_snapshot_ready{snapshot="snap-b",source="blank"} 1
# HELP raid10_volume_hydrated 1 once a restored or cloned volume has copied all of its source (it no longer needs it), else 0; absent for a volume made blank.
# TYPE raid10_volume_hydrated gauge
raid10_volume_hydrated{volume="restore"} 0
# HELP raid10_volume_hydration_copied_bytes Bytes a restored or cloned volume has copied from its source; absent for a volume made blank.
# TYPE raid10_volume_hydration_copied_bytes gauge
raid10_volume_hydration_copied_bytes{volume="restore"} 1.6777216e+07
`), "raid10_snapshot_copied_bytes", "raid10_snapshot_cut_timestamp_seconds", "raid10_snapshot_ready",
		"raid10_volume_hydrated", "raid10_volume_hydration_copied_bytes"); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}
}
