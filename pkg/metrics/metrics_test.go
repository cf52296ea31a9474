package metrics_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// openPool opens a pool on n sparse files of size bytes in t.TempDir().
func openPool(t *testing.T, n int, size int64) (*pool.Pool, []string) {
	t.Helper()
	dir := t.TempDir()
	var cfg pool.Config
	var paths []string
	for i := range n {
		p := filepath.Join(dir, "disk"+string(rune('0'+i))+".img")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: p})
	}
	p, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p, paths
}

// value returns the value of the single series of metric name whose labels include want.
func value(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			}
		}
	}
	return 0, false
}

// TestPoolCollector: the collector reports a real pool on files: I/O counters follow the
// engine's, health and member state follow a failed disk, capacity follows a create.
func TestPoolCollector(t *testing.T) {
	p, paths := openPool(t, 4, 128<<20)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewPoolCollector(p))
	if n, err := testutil.GatherAndCount(metrics.NewRegistry(p), "go_goroutines", "raid10_pool_raw_bytes"); n != 2 || err != nil {
		t.Fatalf("NewRegistry: %d of go_goroutines and raid10_pool_raw_bytes, want both (%v)", n, err)
	}

	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP raid10_pool_free_usable_bytes Free usable capacity after mirroring.
# TYPE raid10_pool_free_usable_bytes gauge
raid10_pool_free_usable_bytes{pool="default"} `+strconv.FormatUint(p.Capacity().FreeUsable, 10)+`
`), "raid10_pool_free_usable_bytes"); err != nil {
		t.Fatal(err)
	}
	freeBefore := p.Capacity().FreeUsable

	if _, err := p.CreateVolume("v1", 64<<20, pool.CreateOptions{Members: 4}); err != nil {
		t.Fatal(err)
	}
	if got, _ := value(t, reg, "raid10_pool_free_usable_bytes", nil); uint64(got) >= freeBefore {
		t.Fatalf("free usable after create: %v, before %d", got, freeBefore)
	}
	arr, err := p.Array("v1")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range 3 {
		if _, err := arr.WriteAt(buf, int64(i)<<20); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := arr.ReadAt(buf[:4096], 0); err != nil {
		t.Fatal(err)
	}
	st := arr.Status()
	for _, c := range []struct {
		name string
		want uint64
	}{
		{"raid10_volume_write_ops_total", st.WriteOps},
		{"raid10_volume_write_bytes_total", st.WriteBytes},
		{"raid10_volume_read_ops_total", st.ReadOps},
		{"raid10_volume_read_bytes_total", st.ReadBytes},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := value(t, reg, c.name, map[string]string{"volume": "v1"})
			if !ok || got != float64(c.want) || c.want == 0 {
				t.Fatalf("%s = %v (found %v), engine says %d", c.name, got, ok, c.want)
			}
		})
	}
	if got, _ := value(t, reg, "raid10_volume_write_bytes_total", map[string]string{"volume": "v1"}); got < 3<<20 {
		t.Fatalf("write bytes %v, wrote 3 MiB", got)
	}
	if got, _ := value(t, reg, "raid10_volume_health", map[string]string{"volume": "v1", "health": "Healthy"}); got != 1 {
		t.Fatalf("health Healthy = %v, want 1", got)
	}
	if got, _ := value(t, reg, "raid10_volume_members_in_sync", map[string]string{"volume": "v1"}); got != 4 {
		t.Fatalf("members in sync = %v, want 4", got)
	}

	// A scrub: the mismatch counter is there from the start (0), the completion time once
	// a scrub has reached the end.
	if got, ok := value(t, reg, "raid10_volume_scrub_mismatches_total", map[string]string{"volume": "v1"}); !ok || got != 0 {
		t.Fatalf("scrub mismatches before any scrub: %v (found %v)", got, ok)
	}
	if _, ok := value(t, reg, "raid10_volume_scrub_last_completed_timestamp_seconds", map[string]string{"volume": "v1"}); ok {
		t.Fatal("scrub completion time before any scrub")
	}
	if _, err := p.StartScrub("v1", pool.ScrubCheck); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if vi, _ := p.Volume("v1"); vi.Scrub != nil && vi.Scrub.State == pool.ScrubDone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("scrub not done after a minute")
		}
	}
	if got, ok := value(t, reg, "raid10_volume_scrub_last_completed_timestamp_seconds", map[string]string{"volume": "v1"}); !ok ||
		got < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Fatalf("scrub completion time %v (found %v)", got, ok)
	}

	// A failed disk: the volume is Degraded, the disk Failed, one member faulty.
	if err := p.FailDisk(paths[2]); err != nil {
		t.Fatal(err)
	}
	if got, _ := value(t, reg, "raid10_volume_health", map[string]string{"volume": "v1", "health": "Degraded"}); got != 1 {
		t.Fatalf("health Degraded = %v after FailDisk, want 1", got)
	}
	if got, _ := value(t, reg, "raid10_volume_members_in_sync", map[string]string{"volume": "v1"}); got != 3 {
		t.Fatalf("members in sync = %v after FailDisk, want 3", got)
	}
	var failed pool.DiskInfo
	for _, d := range p.Disks() {
		if d.Path == paths[2] {
			failed = d
		}
	}
	if got, _ := value(t, reg, "raid10_disk_state", map[string]string{"disk": failed.UUID, "state": "Failed"}); got != 1 {
		t.Fatalf("disk_state Failed = %v for %s, want 1", got, failed.UUID)
	}
	if got, ok := value(t, reg, "raid10_disk_info", map[string]string{"disk": failed.UUID, "path": paths[2]}); !ok || got != 1 {
		t.Fatalf("disk_info for %s: %v %v", paths[2], got, ok)
	}
	if _, ok := value(t, reg, "raid10_volume_member_io_errors_total", map[string]string{"volume": "v1", "op": "write"}); !ok {
		t.Fatal("no member error counters")
	}
	// The pedantic registry checks every metric against its description and for
	// duplicates; lint the names too.
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}
}

// TestPoolCollectorRebuild: while a replaced disk is rebuilt, the sync metrics are present
// with the recovery kind; once Healthy they are gone.
func TestPoolCollectorRebuild(t *testing.T) {
	dir := t.TempDir()
	var cfg pool.Config
	var paths []string
	for i := range 5 {
		p := filepath.Join(dir, "d"+string(rune('0'+i)))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 128<<20); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	for _, p := range paths[:4] {
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: p})
	}
	cfg.RebuildRateMax = 16 << 20
	p, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewPoolCollector(p))
	if _, err := p.CreateVolume("v", 64<<20, pool.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.FailDisk(paths[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ReplaceDisk(paths[0], pool.DiskConfig{Path: paths[4]}); err != nil {
		t.Fatal(err)
	}
	saw := false
	deadline := time.Now().Add(time.Minute)
	for {
		if r, ok := value(t, reg, "raid10_volume_sync_progress_ratio", map[string]string{"volume": "v", "kind": "recovery"}); ok {
			if r < 0 || r > 1 {
				t.Fatalf("progress ratio %v", r)
			}
			saw = true
		}
		if h, _ := value(t, reg, "raid10_volume_health", map[string]string{"volume": "v", "health": "Healthy"}); h == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no rebuild to Healthy within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !saw {
		t.Fatal("never saw raid10_volume_sync_progress_ratio{kind=recovery} during the rebuild")
	}
	// Health and sync progress are read from two snapshots at scrape time, so the progress
	// may lag the Healthy flip by a scrape; it must be gone within two seconds.
	for gone := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, ok := value(t, reg, "raid10_volume_sync_progress_ratio", map[string]string{"volume": "v"}); !ok {
			break
		}
		if time.Now().After(gone) {
			t.Fatal("sync progress still reported 2s after the rebuild")
		}
	}
}

// TestCSIMetrics: calls through the interceptor are counted by method and code.
func TestCSIMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.NewCSIMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ic := m.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/CreateVolume"}
	ok := func(context.Context, any) (any, error) { return "done", nil }
	bad := func(context.Context, any) (any, error) { return nil, status.Error(codes.ResourceExhausted, "full") }
	for range 2 {
		if _, err := ic(t.Context(), nil, info, ok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ic(t.Context(), nil, info, bad); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("interceptor changed the error: %v", err)
	}
	m.Observe("NodeStageVolume", errors.New("not a status"), time.Millisecond)

	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP raid10_csi_operations_total CSI calls handled, by method and gRPC status code.
# TYPE raid10_csi_operations_total counter
raid10_csi_operations_total{code="OK",method="CreateVolume"} 2
raid10_csi_operations_total{code="ResourceExhausted",method="CreateVolume"} 1
raid10_csi_operations_total{code="Unknown",method="NodeStageVolume"} 1
`), "raid10_csi_operations_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "raid10_csi_operation_duration_seconds"); n != 3 {
		t.Fatalf("duration series: %d, want 3", n)
	}
}

// TestServer: /metrics, /healthz and /readyz over real HTTP; readiness follows the check.
func TestServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.NewCSIMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Observe("/csi.v1.Node/NodeGetInfo", nil, time.Millisecond)
	var ready atomic.Bool
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- metrics.ServeListener(ctx, l, reg, func() error {
			if !ready.Load() {
				return errors.New("pool not open")
			}
			return nil
		})
	}()
	base := "http://" + l.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		name, path string
		code       int
		body       string
	}{
		{"Healthz", "/healthz", 200, "ok"},
		{"ReadyzNotReady", "/readyz", 503, "pool not open"},
		{"Metrics", "/metrics", 200, `raid10_csi_operations_total{code="OK",method="NodeGetInfo"} 1`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := get(c.path)
			if code != c.code || !strings.Contains(body, c.body) {
				t.Fatalf("GET %s = %d %q, want %d containing %q", c.path, code, body, c.code, c.body)
			}
		})
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz after the check passes: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeListener after cancel: %v", err)
	}
}

// TestServeAddressInUse: Serve on an address another process still holds (a predecessor
// plugin in the same network namespace) waits for it instead of failing, serves once it is
// free, and returns nil when stopped while it waits; an address that cannot be listened on
// for another reason fails at once.
func TestServeAddressInUse(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()

	t.Run("stopped while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- metrics.Serve(ctx, addr, prometheus.NewRegistry()) }()
		time.Sleep(100 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("Serve on an address in use returned %v before it was stopped", err)
		default:
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Serve stopped while waiting: %v", err)
		}
	})

	t.Run("served once free", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- metrics.Serve(ctx, addr, prometheus.NewRegistry()) }()
		time.Sleep(100 * time.Millisecond)
		if err := held.Close(); err != nil { // the predecessor stops
			t.Fatal(err)
		}
		var resp *http.Response
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if resp, err = http.Get("http://" + addr + "/healthz"); err == nil {
				break
			}
			select {
			case err := <-done:
				t.Fatalf("Serve returned %v instead of serving the freed address", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("nothing serves %s 30 s after it was freed: %v", addr, err)
			}
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("/healthz: %d", resp.StatusCode)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	})

	t.Run("other errors fail", func(t *testing.T) {
		if err := metrics.Serve(t.Context(), "256.0.0.1:1", prometheus.NewRegistry()); err == nil {
			t.Fatal("Serve on an impossible address: no error")
		}
	})
}
