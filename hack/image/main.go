// Command image writes the plugin's image tarballs without Docker (`make image`, run by
// hack/image.sh): the plugin image described by the Dockerfile's final stage (internal/ociimage)
// over a Debian root filesystem tar, and the pause image.
//
//	go run ./hack/image -print-packages            # "<suite> <package>..." from the Dockerfile
//	go run ./hack/image -rootfs ROOTFS.tar -bin DIR [-pause PAUSE] [-sidecar TAG=BINARY]... -out DIR
//
// Each -sidecar wraps one static binary (a CSI sidecar built from its Go module by
// hack/build-tools.sh) as an image of that one file at /<name>, its entrypoint, written to
// <name>.tar.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/raid10-csi/raid10-csi/internal/ociimage"
)

func main() {
	var (
		dockerfile = flag.String("dockerfile", "Dockerfile", "the Dockerfile whose final stage describes the plugin image")
		printPkgs  = flag.Bool("print-packages", false, "print the Debian suite and the packages of the Dockerfile's final stage and exit")
		rootfs     = flag.String("rootfs", "", "the Debian root filesystem tar (hack/image.sh makes it with mmdebstrap)")
		bins       = flag.String("bin", "", "directory holding the files the Dockerfile COPYs, by base name (raid10-csi, kubectl-raid10)")
		pause      = flag.String("pause", "", "the pause binary (hack/pause); empty: no pause image")
		out        = flag.String("out", "_output/image", "directory the tarballs are written to")
		tag        = flag.String("tag", "raid10-csi/raid10-csi:0.1.0", "tag of the plugin image")
		pauseTag   = flag.String("pause-tag", "raid10-csi/pause:0.1.0", "tag of the pause image")
		sidecars   sidecarFlags
	)
	flag.Var(&sidecars, "sidecar", "TAG=BINARY: an image of the one static BINARY, its entrypoint (repeatable)")
	flag.Parse()
	if err := run(*dockerfile, *printPkgs, *rootfs, *bins, *pause, *out, *tag, *pauseTag); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	if err := writeSidecars(sidecars, *out); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(dockerfile string, printPkgs bool, rootfs, bins, pause, out, tag, pauseTag string) error {
	f, err := os.Open(dockerfile)
	if err != nil {
		return err
	}
	df, err := ociimage.ParseDockerfile(f)
	_ = f.Close()
	if err != nil {
		return err
	}
	if printPkgs {
		if len(df.Packages) == 0 {
			return errors.New("the Dockerfile's final stage installs no package")
		}
		fmt.Println(df.Suite, strings.Join(df.Packages, " "))
		return nil
	}
	if rootfs == "" || bins == "" {
		return errors.New("-rootfs and -bin are required")
	}
	if err := ociimage.CheckPackages(rootfs, df.Packages); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	img, err := ociimage.PluginImage(df, rootfs, bins)
	if err != nil {
		return err
	}
	file := filepath.Join(out, "raid10-csi.tar")
	if err := ociimage.Write(img, tag, file); err != nil {
		return err
	}
	if err := ociimage.Verify(file, tag, df); err != nil {
		return err
	}
	fmt.Printf("image: %s (%s, entrypoint %v): files, entrypoint and packages match the Dockerfile\n", file, tag, df.Entrypoint)
	if pause == "" {
		return nil
	}
	pimg, err := ociimage.PauseImage(pause)
	if err != nil {
		return err
	}
	file = filepath.Join(out, "pause.tar")
	if err := ociimage.Write(pimg, pauseTag, file); err != nil {
		return err
	}
	fmt.Printf("image: %s (%s)\n", file, pauseTag)
	return nil
}

// sidecarFlags collects -sidecar TAG=BINARY.
type sidecarFlags []string

func (s *sidecarFlags) String() string { return strings.Join(*s, ",") }

func (s *sidecarFlags) Set(v string) error {
	tag, bin, ok := strings.Cut(v, "=")
	if !ok || tag == "" || bin == "" {
		return fmt.Errorf("want TAG=BINARY, got %q", v)
	}
	*s = append(*s, v)
	return nil
}

// writeSidecars writes one image per TAG=BINARY: the binary at /<base name>, its entrypoint.
func writeSidecars(specs []string, out string) error {
	for _, spec := range specs {
		tag, bin, _ := strings.Cut(spec, "=")
		base := filepath.Base(bin)
		img, err := ociimage.BinaryImage(bin, "/"+base)
		if err != nil {
			return err
		}
		file := filepath.Join(out, base+".tar")
		if err := ociimage.Write(img, tag, file); err != nil {
			return err
		}
		fmt.Printf("image: %s (%s)\n", file, tag)
	}
	return nil
}
