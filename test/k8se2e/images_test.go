package k8se2e

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/raid10-csi/raid10-csi/internal/ociimage"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// e2eRegistry is where KUBE_TEST_REPO_LIST points every registry of the suites' image list
// (k8s.io/kubernetes test/utils/image): a name no one serves, so an image the rig lacks fails
// to pull at once (ErrImagePull naming it) instead of being fetched from somewhere.
const e2eRegistry = "e2e.raid10-csi.invalid"

// The suites' images at KUBE_VERSION (test/utils/image/manifest.go), as the node has them.
// busybox is Debian's busybox-static; nginx is a busybox stand-in (the storage suites only
// run shell commands in it: volumes' exec spec); glibc-dns-testing is busybox with the
// host's GNU dd, dash as /bin/sh and the glibc they link: multiVolume writes with
// `dd oflag=nocache` in it, which busybox's dd refuses ("invalid argument 'nocache' to
// 'oflag'", seen in a run), and busybox's sh runs its own dd whatever PATH says (it prefers
// its applets), so the shell must be another; agnhost is built from its Go package with
// busybox beside it (host-exec pods run nsenter and sh in it).
var (
	busyboxTags = []string{e2eRegistry + "/busybox:1.37.0-2", e2eRegistry + "/nginx:1.27.0-2",
		e2eRegistry + "/nginx:1.28.0-2"}
	glibcTag = e2eRegistry + "/glibc-dns-testing:2.1.1"
	// glibcFiles is GNU dd, dash and what they link (ldd on Debian amd64), image path to
	// host path; /bin/sh replaces busybox's link.
	glibcFiles = map[string]string{
		"/bin/sh":                         "/usr/bin/dash",
		"/usr/bin/dd":                     "/usr/bin/dd",
		"/lib/x86_64-linux-gnu/libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
		"/lib64/ld-linux-x86-64.so.2":     "/lib64/ld-linux-x86-64.so.2",
	}
	agnhostTag = e2eRegistry + "/agnhost:2.66.1"
	// snapshotControllerTag is the chart's default snapshots.controller.image, so that the
	// chart's value stays at its default.
	snapshotControllerTag = "registry.k8s.io/sig-storage/snapshot-controller:v8.7.0"
)

// repoList is the KUBE_TEST_REPO_LIST file: every registry of the list is e2eRegistry.
func repoList() string {
	var b strings.Builder
	for _, k := range []string{"promoterE2eRegistry", "buildImageRegistry", "gcEtcdRegistry", "gcRegistry",
		"sigStorageRegistry", "privateRegistry", "dockerLibraryRegistry", "cloudProviderGcpRegistry"} {
		fmt.Fprintf(&b, "%s: %s\n", k, e2eRegistry)
	}
	b.WriteString("invalidRegistry: invalid." + e2eRegistry + "\n")
	return b.String()
}

// buildImages runs `make image`'s script (plugin, pause, sidecars) into the rig's cache and
// adds the suites' images and the snapshot-controller; it returns the tarballs and the
// chart's sidecars.<key>.image values.
func buildImages(t *testing.T, root, e2eDir string) (files []string, sidecars map[string]string) {
	t.Helper()
	start := time.Now()
	dir := filepath.Join(vm.CacheDir(), "k8se2e", "images")
	cmd := exec.Command("bash", "hack/image.sh")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IMAGE_OUT="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/image.sh: %v\n%s", err, out)
	}
	bb, err := busyboxLayer("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	write := func(img v1.Image, file string, tags ...string) {
		refs := map[name.Reference]v1.Image{}
		for _, tag := range tags {
			ref, err := name.NewTag(tag)
			if err != nil {
				t.Fatal(err)
			}
			refs[ref] = img
		}
		if err := tarball.MultiRefWriteToFile(filepath.Join(dir, file), refs); err != nil {
			t.Fatalf("write %s: %v", file, err)
		}
	}
	write(withConfig(t, []string{"/bin/sh"}, bb), "e2e-busybox.tar", busyboxTags...)
	gnu, err := ociimage.FileLayer(glibcFiles)
	if err != nil {
		t.Fatalf("glibc-dns-testing stand-in (GNU dd, from coreutils): %v", err)
	}
	// dash looks commands up in PATH, where /usr/bin comes before /bin: dd is GNU's, the
	// rest busybox's.
	write(withConfig(t, []string{"/bin/sh"}, bb, gnu), "e2e-glibc.tar", glibcTag)
	agn, err := ociimage.FileLayer(map[string]string{"/agnhost": filepath.Join(e2eDir, "agnhost")})
	if err != nil {
		t.Fatal(err)
	}
	write(withConfig(t, []string{"/agnhost"}, bb, agn), "e2e-agnhost.tar", agnhostTag)
	sc := os.Getenv("RAID10_SNAPSHOT_CONTROLLER")
	if sc == "" {
		t.Fatal("RAID10_SNAPSHOT_CONTROLLER not set: source hack/tool-env.sh after `make deps`")
	}
	img, err := ociimage.BinaryImage(sc, "/snapshot-controller")
	if err != nil {
		t.Fatal(err)
	}
	write(img, "snapshot-controller.tar", snapshotControllerTag)
	files, _ = filepath.Glob(filepath.Join(dir, "*.tar"))
	sidecars = map[string]string{}
	for _, key := range []string{"provisioner", "resizer", "snapshotter"} {
		m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(filepath.Join(dir, "csi-"+key+".tar")) })
		if err != nil || len(m) == 0 || len(m[0].RepoTags) == 0 {
			t.Fatalf("no csi-%s image from hack/image.sh (make deps builds the sidecars): %v", key, err)
		}
		sidecars[key] = m[0].RepoTags[0]
	}
	t.Logf("images built in %v: %v", time.Since(start).Round(time.Second), files)
	return files, sidecars
}

// withConfig is an image of layers with entrypoint, PATH set, linux/amd64.
func withConfig(t *testing.T, entrypoint []string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{ociimage.DefaultPath}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// busyboxLayer is /bin/busybox (the host's busybox-static) with a /bin symlink for each of
// its applets, /tmp (1777) and /etc/passwd and /etc/group naming root and nobody.
func busyboxLayer(bin string) (v1.Layer, error) {
	out, err := exec.Command(bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list (install busybox-static): %w", bin, err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mod := time.Unix(0, 0)
	hdrs := []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755, ModTime: mod},
		{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755, ModTime: mod},
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: mod},
	}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	files := map[string][]byte{
		"bin/busybox": data,
		"etc/passwd":  []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"),
		"etc/group":   []byte("root:x:0:\nnobody:x:65534:\n"),
	}
	for _, n := range []string{"bin/busybox", "etc/group", "etc/passwd"} {
		mode := int64(0o644)
		if n == "bin/busybox" {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode, Size: int64(len(files[n])), ModTime: mod}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, err
		}
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", ModTime: mod}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}
