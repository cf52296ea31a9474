package metrics_test

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestPoolCollectorEncrypted: a real pool on files; volume_encrypted is 1 for the volume
// whose dm-crypt mapping node exists (staged encrypted on this node) and 0 for the other,
// and follows the mapping: 0 again once it is gone.
func TestPoolCollectorEncrypted(t *testing.T) {
	p, _ := openPool(t, 4, 64<<20)
	mapper := t.TempDir()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewPoolCollector(p).WithMapperDir(mapper))
	for _, name := range []string{"vol-enc", "vol-plain"} {
		if _, err := p.CreateVolume(name, 16<<20, pool.CreateOptions{Members: 4}); err != nil {
			t.Fatal(err)
		}
	}
	node := filepath.Join(mapper, crypt.MapperName("vol-enc"))
	if err := syscall.Mknod(node, syscall.S_IFCHR|0o600, 1<<8|3); err != nil {
		t.Skipf("mknod (needs root): %v", err)
	}
	for vol, want := range map[string]float64{"vol-enc": 1, "vol-plain": 0} {
		if got, ok := value(t, reg, "raid10_volume_encrypted", map[string]string{"volume": vol}); !ok || got != want {
			t.Errorf("%s: raid10_volume_encrypted %v (found %v), want %v", vol, got, ok, want)
		}
	}
	if err := syscall.Unlink(node); err != nil {
		t.Fatal(err)
	}
	if got, ok := value(t, reg, "raid10_volume_encrypted", map[string]string{"volume": "vol-enc"}); !ok || got != 0 {
		t.Errorf("vol-enc after its mapping closed: %v (found %v), want 0", got, ok)
	}
}
