package cluster

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/raid10-csi/raid10-csi/internal/ociimage"
	"github.com/raid10-csi/raid10-csi/internal/testenv"
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

// helmBinary returns the pinned helm of hack/csi-tools.sh.
func helmBinary(t testing.TB, root string) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", `source hack/csi-tools.sh && csi_tool helm`)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		testenv.Missing(t, "helm (hack/csi-tools.sh): %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// goBuild builds a static binary of pkg into the rig's cache and returns its path.
func goBuild(t testing.TB, root, pkg string) string {
	t.Helper()
	dir := filepath.Join(vm.CacheDir(), "cluster", "bin")
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := vm.GoCommand(context.Background(), "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// sidecarImages maps the chart's sidecar keys (sidecars.<key>.image) to the sidecar images
// hack/image.sh wrote (raid10-csi/csi-<key>:<version>, read from each tarball's manifest), for
// the keys the chart's values.yaml has: a sidecar the chart gains later (csi-snapshotter) is
// set as soon as both exist.
func sidecarImages(t testing.TB, root string, files []string) map[string]string {
	t.Helper()
	values, err := os.ReadFile(filepath.Join(root, "charts/raid10-csi/values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(f) })
		if err != nil {
			t.Fatalf("cluster: %s: %v", f, err)
		}
		for _, d := range m {
			for _, tag := range d.RepoTags {
				key, ok := strings.CutPrefix(tag, "raid10-csi/csi-")
				if !ok {
					continue
				}
				key, _, _ = strings.Cut(key, ":")
				if bytes.Contains(values, []byte("\n  "+key+":")) {
					out[key] = tag
				}
			}
		}
	}
	for _, want := range []string{"provisioner", "resizer"} {
		if out[want] == "" {
			t.Fatalf("cluster: no image for sidecars.%s (images %v)", want, files)
		}
	}
	return out
}

// buildImages runs `make image`'s script (plugin, pause and sidecar images) into the rig's
// cache, adds the ioverify workload image, and returns the tarballs.
func buildImages(t testing.TB, root string) []string {
	t.Helper()
	dir := filepath.Join(vm.CacheDir(), "cluster", "images")
	start := time.Now()
	cmd := exec.Command("bash", "hack/image.sh")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IMAGE_OUT="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cluster: hack/image.sh: %v\n%s", err, out)
	}
	bin := goBuild(t, root, "./test/cluster/ioverify")
	img, err := ociimage.BinaryImage(bin, "/ioverify")
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.Write(img, ioImage, filepath.Join(dir, "ioverify.tar")); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster: images built in %v:\n%s", time.Since(start).Round(time.Second), out)
	files, _ := filepath.Glob(filepath.Join(dir, "*.tar"))
	for _, want := range []string{"raid10-csi.tar", "pause.tar", "csi-provisioner.tar", "csi-resizer.tar"} {
		if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
			t.Fatalf("cluster: image %s missing after hack/image.sh (are the sidecars built? make deps): %v", want, err)
		}
	}
	return files
}
