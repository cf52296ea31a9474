package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestPoolCollectorLimits: a real pool on files. The limit gauges show the limits the pool
// put on the array (bursts as the engine uses them, the default share of the rate where none
// was set) and are absent without them; the throttle counters follow the engine's own counts
// of the writes the limit delayed, and are there, at 0, before any.
func TestPoolCollectorLimits(t *testing.T) {
	p, _ := openPool(t, 4, 64<<20)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewPoolCollector(p))
	if _, err := p.CreateVolume("v1", 16<<20, pool.CreateOptions{Members: 4}); err != nil {
		t.Fatal(err)
	}
	vol := map[string]string{"volume": "v1", "op": "write"}
	if _, ok := value(t, reg, "raid10_volume_limit_ops_per_second", vol); ok {
		t.Fatal("write IOPS limit reported before any was set")
	}
	if got, ok := value(t, reg, "raid10_volume_throttled_requests_total", vol); !ok || got != 0 {
		t.Fatalf("throttled writes before any limit: %v (found %v), want 0", got, ok)
	}

	// 200 writes/s with a burst of 1: of 6 writes at once, the last 5 wait (25 ms in all).
	if err := p.SetVolumeLimits("v1", raid10.Limits{WriteIOPS: 200, WriteIOPSBurst: 1, ReadBytesPerSecond: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	arr, err := p.Array("v1")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := range 6 {
		if _, err := arr.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	th := arr.Status().Throttle
	if th.WritesDelayed == 0 {
		t.Fatal("engine: no write delayed under 200 writes/s with a burst of 1")
	}
	for _, c := range []struct {
		name string
		op   string
		want float64
	}{
		{"raid10_volume_limit_ops_per_second", "write", 200},
		{"raid10_volume_limit_burst_ops", "write", 1},
		{"raid10_volume_limit_bytes_per_second", "read", 8 << 20},
		{"raid10_volume_limit_burst_bytes", "read", float64(int64(raid10.DefaultBurst.Seconds() * (8 << 20)))},
		{"raid10_volume_throttled_requests_total", "write", float64(th.WritesDelayed)},
		{"raid10_volume_throttle_wait_seconds_total", "write", th.WriteDelay.Seconds()},
		{"raid10_volume_throttled_requests_total", "read", 0},
		{"raid10_volume_throttled_bytes_total", "write", float64(th.WritesDelayed * 4096)},
		{"raid10_volume_throttled_bytes_total", "read", 0},
	} {
		t.Run(c.name+"/"+c.op, func(t *testing.T) {
			got, ok := value(t, reg, c.name, map[string]string{"volume": "v1", "op": c.op})
			if !ok || got != c.want {
				t.Fatalf("%s{op=%q} = %v (found %v), want %v", c.name, c.op, got, ok, c.want)
			}
		})
	}
	for _, absent := range []struct{ name, op string }{
		{"raid10_volume_limit_ops_per_second", "read"},
		{"raid10_volume_limit_bytes_per_second", "write"},
	} {
		if got, ok := value(t, reg, absent.name, map[string]string{"volume": "v1", "op": absent.op}); ok {
			t.Errorf("%s{op=%q} = %v for a limit not set, want absent", absent.name, absent.op, got)
		}
	}
	if waited, _ := value(t, reg, "raid10_volume_throttle_wait_seconds_total", vol); waited < 0.015 {
		t.Errorf("writes waited %v s in all, want about 0.025 (5 writes at 200/s)", waited)
	}

	// Lifted: the gauges go, the counters stay.
	if err := p.SetVolumeLimits("v1", raid10.Limits{}); err != nil {
		t.Fatal(err)
	}
	if got, ok := value(t, reg, "raid10_volume_limit_ops_per_second", vol); ok {
		t.Fatalf("write IOPS limit %v after the limits were lifted, want absent", got)
	}
	if got, _ := value(t, reg, "raid10_volume_throttled_requests_total", vol); got != float64(th.WritesDelayed) {
		t.Fatalf("throttled writes %v after the limits were lifted, want %d (a counter)", got, th.WritesDelayed)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}
}
