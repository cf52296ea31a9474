package metrics_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// statusSource serves a fixed pool snapshot and no arrays (no I/O counters).
type statusSource struct{ st pool.Status }

func (s statusSource) Status() pool.Status { return s.st }
func (s statusSource) Array(string) (*raid10.Array, error) {
	return nil, errors.New("no arrays here")
}

// TestPoolCollectorBlocks: bad and lost blocks per volume, bad blocks, deadline timeouts and
// stalls of a last copy per member, as the engine reports them through the pool.
func TestPoolCollectorBlocks(t *testing.T) {
	src := statusSource{pool.Status{Name: "default", Volumes: []pool.VolumeInfo{
		{Name: "clean", Health: pool.Healthy, Members: []pool.MemberInfo{
			{Role: 0, DiskUUID: "d0", State: "in-sync"}, {Role: 1, DiskUUID: "d1", State: "in-sync"}}},
		{Name: "worn", Health: pool.Degraded, BadBlocks: 5, LostBlocks: 2, TimedOut: 3, Members: []pool.MemberInfo{
			{Role: 0, DiskUUID: "d0", State: "in-sync", BadBlocks: 3, TimedOut: 1},
			{Role: 1, DiskUUID: "d1", State: "in-sync", BadBlocks: 2, TimedOut: 2, SlowLastCopy: 4}}},
	}}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewPoolCollector(src))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP raid10_volume_bad_blocks Blocks (4 KiB) recorded bad, summed over the members; each is still read from its other copy unless lost.
# TYPE raid10_volume_bad_blocks gauge
raid10_volume_bad_blocks{volume="clean"} 0
raid10_volume_bad_blocks{volume="worn"} 5
# HELP raid10_volume_lost_blocks Blocks bad on every copy: reads there fail with an I/O error until the block is written again.
# TYPE raid10_volume_lost_blocks gauge
raid10_volume_lost_blocks{volume="clean"} 0
raid10_volume_lost_blocks{volume="worn"} 2
# HELP raid10_volume_member_bad_blocks Blocks recorded bad on one member of a volume; sum by (disk) for a disk.
# TYPE raid10_volume_member_bad_blocks gauge
raid10_volume_member_bad_blocks{disk="d0",member="0",volume="clean"} 0
raid10_volume_member_bad_blocks{disk="d0",member="0",volume="worn"} 3
raid10_volume_member_bad_blocks{disk="d1",member="1",volume="clean"} 0
raid10_volume_member_bad_blocks{disk="d1",member="1",volume="worn"} 2
# HELP raid10_volume_member_timeouts_total Requests of one member of a volume that passed the member deadline (--member-timeout); each fails the member.
# TYPE raid10_volume_member_timeouts_total counter
raid10_volume_member_timeouts_total{disk="d0",member="0",volume="clean"} 0
raid10_volume_member_timeouts_total{disk="d0",member="0",volume="worn"} 1
raid10_volume_member_timeouts_total{disk="d1",member="1",volume="clean"} 0
raid10_volume_member_timeouts_total{disk="d1",member="1",volume="worn"} 2
# HELP raid10_volume_member_slow_last_copy_total Stalls past the member deadline of one member of a volume that were waited for, not failed: it held the last in-sync copy of some chunk, or the other copy was late too.
# TYPE raid10_volume_member_slow_last_copy_total counter
raid10_volume_member_slow_last_copy_total{disk="d0",member="0",volume="clean"} 0
raid10_volume_member_slow_last_copy_total{disk="d0",member="0",volume="worn"} 0
raid10_volume_member_slow_last_copy_total{disk="d1",member="1",volume="clean"} 0
raid10_volume_member_slow_last_copy_total{disk="d1",member="1",volume="worn"} 4
`), "raid10_volume_bad_blocks", "raid10_volume_lost_blocks", "raid10_volume_member_bad_blocks", "raid10_volume_member_timeouts_total",
		"raid10_volume_member_slow_last_copy_total"); err != nil {
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
