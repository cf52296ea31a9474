package metrics_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// serverStats is the IOSource of one server, as volume "v1".
type serverStats struct{ srv *nbd.Server }

func (s serverStats) IOStats() map[string]nbd.Stats {
	st, _ := s.srv.Stats("")
	return map[string]nbd.Stats{"v1": st}
}

// TestIOCollector copies an image into a real NBD server with nbdcopy (libnbd) and checks
// that the collector reports the writes, their bytes and a latency histogram holding them.
func TestIOCollector(t *testing.T) {
	testenv.Tool(t, "nbdcopy", "Debian package libnbd-bin")
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(img, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	fb, err := nbd.OpenFileBackend(img, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	srv, err := nbd.NewServer(nbd.Options{}, nbd.Export{Backend: fb})
	if err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(dir, "run")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "nbd.sock")
	ln, err := nbd.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	src := filepath.Join(dir, "src.img")
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i)
	}
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nbdcopy", src, "nbd+unix:///?socket="+sock).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy: %v\n%s", err, out)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewIOCollector(serverStats{srv}))
	w := map[string]string{"volume": "v1", "op": "write"}
	if n, ok := value(t, reg, "raid10_volume_requests_total", w); !ok || n < 1 {
		t.Errorf("write requests %v (found %v), want at least 1", n, ok)
	}
	if n, _ := value(t, reg, "raid10_volume_request_bytes_total", w); n < float64(len(data)) {
		t.Errorf("write bytes %v, want at least %d", n, len(data))
	}
	if n, _ := value(t, reg, "raid10_volume_request_errors_total", w); n != 0 {
		t.Errorf("write errors %v, want 0", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "raid10_volume_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == "write" {
					h := m.GetHistogram()
					found = true
					if h.GetSampleCount() < 1 || h.GetSampleSum() <= 0 || len(h.GetBucket()) != len(nbd.LatencyBounds) {
						t.Errorf("write latency: count %d sum %v buckets %d", h.GetSampleCount(), h.GetSampleSum(), len(h.GetBucket()))
					}
					if last := h.GetBucket()[len(h.GetBucket())-1]; last.GetCumulativeCount() > h.GetSampleCount() {
						t.Errorf("write latency: bucket %v holds %d of %d", last.GetUpperBound(), last.GetCumulativeCount(), h.GetSampleCount())
					}
				}
			}
		}
	}
	if !found {
		t.Error("no raid10_volume_request_duration_seconds{op=write}")
	}
}
