package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/test/vm"
)

// repoRoot is the checkout (the test runs in test/cluster).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildImages runs `make image`'s script into a cache directory and returns the tarballs.
func buildImages(t testing.TB) (dir string, files []string) {
	t.Helper()
	dir = filepath.Join(vm.CacheDir(), "cluster", "images")
	start := time.Now()
	cmd := exec.Command("bash", "hack/image.sh")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "IMAGE_OUT="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cluster: hack/image.sh: %v\n%s", err, out)
	}
	t.Logf("cluster: images built in %v:\n%s", time.Since(start).Round(time.Second), out)
	files, _ = filepath.Glob(filepath.Join(dir, "*.tar"))
	return dir, files
}

func TestClusterBoot(t *testing.T) {
	vm.HostHalf(t)
	_, images := buildImages(t)
	r := New(t, Config{NVMe: 4, DiskSize: 1 << 30, StateSize: 3 << 30, Images: images,
		SandboxImage: "docker.io/raid10-csi/pause:0.1.0", Memory: 3072})
	ctx := context.Background()
	r.Boot(ctx)
	out, err := r.Exec(ctx, "ls -l /dev/disk/by-id; crictl --version || true; ctr -n k8s.io images ls -q")
	t.Logf("%s %v", out, err)
}
