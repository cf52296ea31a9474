package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// repoDockerfile parses the repository's Dockerfile.
func repoDockerfile(t *testing.T) *Dockerfile {
	t.Helper()
	f, err := os.Open("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	df, err := ParseDockerfile(f)
	if err != nil {
		t.Fatalf("the repository's Dockerfile: %v", err)
	}
	return df
}

// TestRepoDockerfile: what the image builder reads from the repository's Dockerfile is the
// plugin image the chart runs: both binaries, raid10-csi the entrypoint, the filesystem
// tools the node plugin execs, on Debian.
func TestRepoDockerfile(t *testing.T) {
	df := repoDockerfile(t)
	want := &Dockerfile{
		Base: "debian:bookworm-slim", Suite: "bookworm",
		Packages:   []string{"e2fsprogs", "xfsprogs", "util-linux", "kmod", "cryptsetup-bin"},
		Files:      []File{{"/usr/local/bin/raid10-csi", "raid10-csi"}, {"/usr/local/bin/kubectl-raid10", "kubectl-raid10"}},
		Entrypoint: []string{"/usr/local/bin/raid10-csi"},
	}
	if !reflect.DeepEqual(df, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", df, want)
	}
}

func TestParseDockerfileErrors(t *testing.T) {
	const ok = "FROM debian:bookworm-slim\nCOPY a /usr/bin/\n"
	for _, tc := range []struct{ name, text, want string }{
		{"no FROM", "COPY a /b\n", "no FROM"},
		{"not Debian", "FROM alpine:3.20\nENTRYPOINT [\"/a\"]\n", "Debian"},
		{"untagged Debian", "FROM debian\nENTRYPOINT [\"/a\"]\n", "Debian"},
		{"shell-form entrypoint", ok + "ENTRYPOINT /usr/bin/a\n", "exec form"},
		{"empty entrypoint", ok + "ENTRYPOINT []\n", "exec form"},
		{"no entrypoint", ok, "no ENTRYPOINT"},
		{"unsupported instruction", ok + "USER 1000\nENTRYPOINT [\"/usr/bin/a\"]\n", "line 3 (USER)"},
		{"COPY option", "FROM debian:bookworm\nCOPY --chmod=0700 a /usr/bin/\nENTRYPOINT [\"/a\"]\n", "--chmod"},
		{"COPY without destination", "FROM debian:bookworm\nCOPY a\nENTRYPOINT [\"/a\"]\n", "source and a destination"},
		{"COPY to a relative path", "FROM debian:bookworm\nCOPY a bin/\nENTRYPOINT [\"/a\"]\n", "absolute"},
		{"COPY of two to a file", "FROM debian:bookworm\nCOPY a b /usr/bin/x\nENTRYPOINT [\"/a\"]\n", "end in /"},
		{"dangling continuation", ok + "ENTRYPOINT [\"/a\"] \\\n", "continuation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDockerfile(strings.NewReader(tc.text))
			if !errors.Is(err, ErrDockerfile) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrDockerfile naming %q", err, tc.want)
			}
		})
	}
	// Earlier stages are not the image: only the last FROM's instructions count.
	df, err := ParseDockerfile(strings.NewReader("FROM golang:1.26 AS build\nWORKDIR /src\nRUN apt-get install -y gcc\n" +
		"FROM debian:trixie\nRUN apt-get update && apt-get -y install --no-install-recommends a b; rm -rf x\nCOPY --from=build /out/x /y/\nENTRYPOINT [\"/y/x\", \"-v\"]\n"))
	if err != nil || df.Suite != "trixie" || strings.Join(df.Packages, " ") != "a b" || df.Files[0] != (File{"/y/x", "x"}) || len(df.Entrypoint) != 2 {
		t.Fatalf("multi-stage: %+v, %v", df, err)
	}
}

// writeTar writes a tar of name -> content (directories end in /).
func writeTar(t *testing.T, file string, entries map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		h := &tar.Header{Name: n, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(entries[n]))}
		if strings.HasSuffix(n, "/") {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(entries[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPluginImageMatchesDockerfile builds the plugin image from the repository's Dockerfile
// on a small input (a stand-in root filesystem whose dpkg status lists the Dockerfile's
// packages, stand-in binaries), writes the tarball, reads it back as `docker load` would and
// checks it against the Dockerfile: the entrypoint, and a top layer holding exactly the
// COPY files (mode 0755) with the right contents over the root filesystem layer.
func TestPluginImageMatchesDockerfile(t *testing.T) {
	df := repoDockerfile(t)
	dir := t.TempDir()
	var status strings.Builder
	for _, p := range df.Packages {
		status.WriteString("Package: " + p + "\nStatus: install ok installed\n\n")
	}
	rootfs := filepath.Join(dir, "rootfs.tar")
	writeTar(t, rootfs, map[string]string{"./": "", "./usr/": "", "./usr/bin/": "", "./usr/bin/sh": "#!", "./var/lib/dpkg/status": status.String()})
	if err := CheckPackages(rootfs, df.Packages); err != nil {
		t.Fatalf("CheckPackages: %v", err)
	}
	bins := filepath.Join(dir, "bin")
	if err := os.Mkdir(bins, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range df.Files {
		if err := os.WriteFile(filepath.Join(bins, f.Source), []byte("binary "+f.Source), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img, err := PluginImage(df, rootfs, bins)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "raid10-csi.tar")
	if err := Write(img, "raid10-csi/raid10-csi:test", file); err != nil {
		t.Fatal(err)
	}
	tag := "raid10-csi/raid10-csi:test"
	if err := Verify(file, tag, df); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(file, &ref)
	if err != nil {
		t.Fatalf("read the tarball back: %v", err)
	}
	cf, err := back.ConfigFile()
	if err != nil || cf.OS != "linux" || cf.Architecture == "" {
		t.Fatalf("config: os %q arch %q: %v", cf.OS, cf.Architecture, err)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("%d layers (%v)", len(layers), err)
	}
	if base, err := layerFiles(layers[0]); err != nil || base["/var/lib/dpkg/status"] == 0 || base["/usr/bin/sh"] == 0 {
		t.Fatalf("root filesystem layer: %v %v", base, err)
	}
	// The same tarball against a Dockerfile that differs in each checked point.
	for _, tc := range []struct {
		name string
		mod  func(d *Dockerfile)
	}{
		{"entrypoint", func(d *Dockerfile) { d.Entrypoint = []string{"/usr/local/bin/kubectl-raid10"} }},
		{"one COPY file more", func(d *Dockerfile) { d.Files = append(d.Files, File{"/usr/local/bin/extra", "extra"}) }},
		{"one COPY file less", func(d *Dockerfile) { d.Files = d.Files[:1] }},
		{"a package more", func(d *Dockerfile) { d.Packages = append(d.Packages, "btrfs-progs") }},
	} {
		other := *df
		other.Files = append([]File(nil), df.Files...)
		other.Packages = append([]string(nil), df.Packages...)
		tc.mod(&other)
		if err := Verify(file, tag, &other); err == nil {
			t.Errorf("Verify against a Dockerfile with another %s: passed", tc.name)
		}
	}
	// Same inputs, same image.
	again, err := PluginImage(df, rootfs, bins)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Fatalf("two builds of the same inputs: %s and %s", d1, d2)
	}

	// A root filesystem without a package, and missing inputs, are errors.
	writeTar(t, rootfs, map[string]string{"./var/lib/dpkg/status": "Package: kmod\nStatus: install ok installed\n\nPackage: xfsprogs\nStatus: deinstall ok config-files\n"})
	if err := CheckPackages(rootfs, df.Packages); !errors.Is(err, ErrMissingPackage) || !strings.Contains(err.Error(), "xfsprogs") || strings.Contains(err.Error(), "kmod") {
		t.Fatalf("CheckPackages without them: %v", err)
	}
	writeTar(t, rootfs, map[string]string{"./etc/": ""})
	if err := CheckPackages(rootfs, df.Packages); err == nil || !strings.Contains(err.Error(), "dpkg/status") {
		t.Fatalf("CheckPackages without a dpkg status: %v", err)
	}
	if err := os.Remove(filepath.Join(bins, df.Files[0].Source)); err != nil {
		t.Fatal(err)
	}
	if _, err := PluginImage(df, rootfs, bins); err == nil || !strings.Contains(err.Error(), df.Files[0].Path) {
		t.Fatalf("PluginImage without %s: %v", df.Files[0].Source, err)
	}
	if _, err := PluginImage(df, filepath.Join(dir, "nope.tar"), bins); err == nil {
		t.Fatal("PluginImage without a root filesystem succeeded")
	}
	if err := Write(img, "Bad Tag", filepath.Join(dir, "x.tar")); err == nil {
		t.Fatal("Write with a malformed tag succeeded")
	}
}

// TestPauseImage: /pause is the only file and the entrypoint.
func TestPauseImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "pause")
	if err := os.WriteFile(bin, []byte("pause"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := PauseImage(bin)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil || !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/pause"}) {
		t.Fatalf("entrypoint %v, %v", cf.Config.Entrypoint, err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d %v", len(layers), err)
	}
	if files, err := layerFiles(layers[0]); err != nil || !reflect.DeepEqual(files, map[string]int64{"/pause": 0o755}) {
		t.Fatalf("files %v %v", files, err)
	}
}
