package ociimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPath is the PATH of the images, Docker's default for a Debian image.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is the modification time of every file the builder writes: the same inputs give
// the same layer digests.
var epoch = time.Unix(0, 0).UTC()

// PluginImage stacks the root filesystem (an uncompressed tar, as mmdebstrap writes it), a
// layer with df's COPY files, each from bins/<source base name> (mode 0755, owned by root,
// as COPY of an executable leaves it) and df's ENTRYPOINT, for linux on this architecture.
func PluginImage(df *Dockerfile, rootfs, bins string) (v1.Image, error) {
	if _, err := os.Stat(rootfs); err != nil {
		return nil, fmt.Errorf("ociimage: root filesystem: %w", err)
	}
	base, err := tarball.LayerFromFile(rootfs)
	if err != nil {
		return nil, fmt.Errorf("ociimage: root filesystem layer: %w", err)
	}
	files := map[string]string{}
	for _, f := range df.Files {
		files[f.Path] = filepath.Join(bins, f.Source)
	}
	top, err := FileLayer(files)
	if err != nil {
		return nil, err
	}
	return image(df.Entrypoint, base, top)
}

// PauseImage is the pod sandbox image: the pause binary at /pause, its entrypoint.
func PauseImage(pause string) (v1.Image, error) {
	l, err := FileLayer(map[string]string{"/pause": pause})
	if err != nil {
		return nil, err
	}
	return image([]string{"/pause"}, l)
}

// BinaryImage is an image of one static binary at path, its entrypoint: a CSI sidecar
// built from its Go module, for a node without registry access.
func BinaryImage(bin, path string) (v1.Image, error) {
	l, err := FileLayer(map[string]string{path: bin})
	if err != nil {
		return nil, err
	}
	return image([]string{path}, l)
}

func image(entrypoint []string, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("ociimage: layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{DefaultPath}
	return mutate.ConfigFile(img, cf)
}

// FileLayer is a layer holding each host file of files (image path -> host path) at its
// image path, mode 0755, owned by root, with its parent directories (0755).
func FileLayer(files map[string]string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := make([]string, 0, len(files))
	for p := range files {
		if !path.IsAbs(p) {
			return nil, fmt.Errorf("ociimage: image path %q must be absolute", p)
		}
		paths = append(paths, p)
	}
	sort.Strings(paths)
	dirs := map[string]bool{}
	for _, p := range paths {
		var parents []string
		for d := path.Dir(p); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		b, err := os.ReadFile(files[p])
		if err != nil {
			return nil, fmt.Errorf("ociimage: file for %s: %w", p, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: 0o755, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// Write writes img as an image tarball tagged tag (docker save format, which docker load,
// podman load and ctr images import read).
func Write(img v1.Image, tag, file string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("ociimage: tag %q: %w", tag, err)
	}
	if err := tarball.WriteToFile(file, ref, img); err != nil {
		return fmt.Errorf("ociimage: write %s: %w", file, err)
	}
	return nil
}

// ErrMissingPackage is wrapped by CheckPackages' error.
var ErrMissingPackage = errors.New("ociimage: package not installed in the root filesystem")

// CheckPackages reads var/lib/dpkg/status from the root filesystem tar and reports the
// packages of pkgs that are not "install ok installed" there.
func CheckPackages(rootfs string, pkgs []string) error {
	f, err := os.Open(rootfs)
	if err != nil {
		return fmt.Errorf("ociimage: root filesystem: %w", err)
	}
	defer func() { _ = f.Close() }()
	installed, err := packagesIn(f)
	if err != nil {
		return fmt.Errorf("ociimage: %s: %w", rootfs, err)
	}
	return missing(installed, pkgs)
}

// packagesIn reads var/lib/dpkg/status from a root filesystem tar stream.
func packagesIn(r io.Reader) (map[string]bool, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no var/lib/dpkg/status in the root filesystem")
		}
		if err != nil {
			return nil, fmt.Errorf("read the root filesystem: %w", err)
		}
		if path.Clean(strings.TrimPrefix(h.Name, "./")) == "var/lib/dpkg/status" {
			return dpkgInstalled(tr)
		}
	}
}

// missing reports the packages of pkgs that installed lacks.
func missing(installed map[string]bool, pkgs []string) error {
	var out []string
	for _, p := range pkgs {
		if !installed[p] {
			out = append(out, p)
		}
	}
	if len(out) > 0 {
		return fmt.Errorf("%w: %s", ErrMissingPackage, strings.Join(out, ", "))
	}
	return nil
}

// dpkgInstalled parses a dpkg status file: the packages whose Status is "install ok
// installed".
func dpkgInstalled(r io.Reader) (map[string]bool, error) {
	out := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	pkg := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			pkg = ""
		case strings.HasPrefix(line, "Package: "):
			pkg = strings.TrimPrefix(line, "Package: ")
		case strings.HasPrefix(line, "Status: ") && pkg != "":
			out[pkg] = strings.TrimPrefix(line, "Status: ") == "install ok installed"
		}
	}
	return out, sc.Err()
}

// ErrMismatch is wrapped by Verify's error.
var ErrMismatch = errors.New("ociimage: the image does not match the Dockerfile")

// Verify reads the image tarball file back (as `docker load` would) and checks it against
// df: the entrypoint, a top layer holding exactly df's COPY files (mode 0755) and, below it,
// a root filesystem with every package of df installed. PluginImage's output passes; an
// image built from another Dockerfile does not.
func Verify(file, tag string, df *Dockerfile) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("ociimage: tag %q: %w", tag, err)
	}
	img, err := tarball.ImageFromPath(file, &ref)
	if err != nil {
		return fmt.Errorf("ociimage: read %s: %w", file, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("ociimage: config of %s: %w", file, err)
	}
	if strings.Join(cf.Config.Entrypoint, "\x00") != strings.Join(df.Entrypoint, "\x00") {
		return fmt.Errorf("%w: entrypoint %q, the Dockerfile's %q", ErrMismatch, cf.Config.Entrypoint, df.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if len(layers) != 2 {
		return fmt.Errorf("%w: %d layers, want the root filesystem and the COPY layer", ErrMismatch, len(layers))
	}
	top, err := layerFiles(layers[1])
	if err != nil {
		return err
	}
	want := map[string]int64{}
	for _, f := range df.Files {
		want[f.Path] = 0o755
	}
	if fmt.Sprint(top) != fmt.Sprint(want) { // fmt prints maps sorted by key
		return fmt.Errorf("%w: COPY layer holds %v, the Dockerfile's COPY gives %v", ErrMismatch, top, want)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		return err
	}
	defer func() { _ = rc.Close() }()
	installed, err := packagesIn(rc)
	if err != nil {
		return err
	}
	return missing(installed, df.Packages)
}

// layerFiles lists the regular files of a layer (absolute paths) with their modes.
func layerFiles(l v1.Layer) (map[string]int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	out := map[string]int64{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			out["/"+strings.TrimPrefix(h.Name, "./")] = h.Mode
		}
	}
}
