package vm

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// initScript is /init in the initramfs: busybox sh. It only brings up what is needed
// to reach the host root over 9p; everything else is in the per-run config.sh.
//
//go:embed init.sh
var initScript []byte

// bootModules are the modules the initramfs itself loads (with their dependencies):
// enough to mount the 9p shares. Everything else is loaded with the host's modprobe
// inside the chroot, from the host's /lib/modules over 9p.
var bootModules = []string{"virtio_pci", "9pnet_virtio", "9p", "virtio-rng"}

// busyboxPaths are where busybox-static may live.
var busyboxPaths = []string{"/bin/busybox", "/usr/bin/busybox", "/usr/lib/busybox/busybox-static"}

// CacheDir is where the harness keeps initramfs images and run directories:
// ${RAID10_CACHE:-$HOME/.cache/raid10-csi}/vm.
func CacheDir() string { return filepath.Join(cacheBase(), "vm") }

// cacheBase is the project's cache, ${RAID10_CACHE:-$HOME/.cache/raid10-csi}, the base of
// hack/versions.sh's cached tools and kernels.
func cacheBase() string {
	if base := os.Getenv("RAID10_CACHE"); base != "" {
		return base
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "raid10-csi")
}

// findBusybox returns a statically linked busybox.
func findBusybox() (string, error) {
	for _, p := range busyboxPaths {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		_ = f.Close()
		if static {
			return p, nil
		}
	}
	return "", errors.New("vm: no statically linked busybox found (Debian package busybox-static; run `make deps`)")
}

// initramfsFile is one regular file of the image.
type initramfsFile struct {
	name string // path inside the image, no leading slash
	mode uint32 // permission bits
	data []byte
}

// BuildInitramfs builds (or reuses from the cache) the initramfs for k and returns
// its path. The file name holds the kernel version and a hash of the content, so a
// changed init script, busybox or module is a new image and an unchanged one is reused.
func BuildInitramfs(ctx context.Context, k Kernel) (string, error) {
	bb, err := findBusybox()
	if err != nil {
		return "", err
	}
	bbData, err := os.ReadFile(bb)
	if err != nil {
		return "", err
	}
	kos, err := moduleDeps(ctx, k, bootModules...)
	if err != nil {
		return "", err
	}
	files := []initramfsFile{
		{name: "init", mode: 0o755, data: initScript},
		{name: "bin/busybox", mode: 0o755, data: bbData},
	}
	var list strings.Builder
	for _, ko := range kos {
		data, name, err := readModule(ctx, ko)
		if err != nil {
			return "", err
		}
		files = append(files, initramfsFile{name: "modules/" + name, mode: 0o644, data: data})
		fmt.Fprintf(&list, "/modules/%s\n", name)
	}
	files = append(files, initramfsFile{name: "modules.list", mode: 0o644, data: []byte(list.String())})

	h := sha256.New()
	for _, f := range files {
		_, _ = fmt.Fprintf(h, "%s %o %d\n", f.name, f.mode, len(f.data))
		h.Write(f.data)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	dir := CacheDir()
	out := filepath.Join(dir, fmt.Sprintf("initramfs-%s-%s.cpio", k.Version, sum))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	w := &cpioWriter{w: &buf, ino: 1}
	for _, d := range []string{"bin", "sbin", "dev", "proc", "sys", "host", "vmrun", "modules", "tmp"} {
		w.dir(d)
	}
	w.chardev("dev/console", 0o600, 5, 1)
	for _, f := range files {
		w.file(f.name, f.mode, f.data)
	}
	w.trailer()
	if w.err != nil {
		return "", w.err
	}
	// Write to a temporary name and rename: concurrent builders (parallel tests,
	// other engineers) never see a half-written image.
	if err := writeFileAtomic(out, buf.Bytes()); err != nil {
		return "", err
	}
	return out, nil
}

// readModule reads a .ko, decompressing .ko.xz/.ko.zst/.ko.gz (busybox insmod
// takes plain ELF only), and returns the data and its file name in the image.
func readModule(ctx context.Context, p string) ([]byte, string, error) {
	base := path.Base(p)
	switch {
	case strings.HasSuffix(base, ".ko"):
		b, err := os.ReadFile(p)
		return b, base, err
	case strings.HasSuffix(base, ".ko.gz"):
		f, err := os.Open(p)
		if err != nil {
			return nil, "", err
		}
		defer func() { _ = f.Close() }()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, "", fmt.Errorf("vm: %s: %w", p, err)
		}
		b, err := io.ReadAll(zr)
		return b, strings.TrimSuffix(base, ".gz"), err
	case strings.HasSuffix(base, ".ko.xz"), strings.HasSuffix(base, ".ko.zst"):
		tool, ext := "xz", ".xz"
		if strings.HasSuffix(base, ".zst") {
			tool, ext = "zstd", ".zst"
		}
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, tool, "-dc", p)
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			return nil, "", fmt.Errorf("vm: %s -dc %s: %w: %s", tool, p, err, stderr.String())
		}
		return b, strings.TrimSuffix(base, ext), nil
	}
	return nil, "", fmt.Errorf("vm: unknown module file type %s", p)
}

// cpioWriter writes the "newc" (SVR4, no CRC) format the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rmaj, rmin uint32) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmaj, rmin, len(name)+1, 0)
	var b bytes.Buffer
	b.WriteString(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(data)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	_, c.err = c.w.Write(b.Bytes())
}

func (c *cpioWriter) dir(name string) { c.entry(name, 0o040755, nil, 0, 0) }

func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, 0o100000|perm, data, 0, 0)
}

func (c *cpioWriter) chardev(name string, perm, major, minor uint32) {
	c.entry(name, 0o020000|perm, nil, major, minor)
}

func (c *cpioWriter) trailer() { c.entry("TRAILER!!!", 0, nil, 0, 0) }
