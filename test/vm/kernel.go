package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNoKernel is returned when no kernel of the series asked for is found: neither a
// /boot/vmlinuz-<kver> with a matching /lib/modules/<kver> on the host, nor one unpacked
// into the cache (CachedKernelDir).
var ErrNoKernel = errors.New("vm: no kernel found (need /boot/vmlinuz-<kver> and /lib/modules/<kver>; run `make deps`)")

// Kernel series (major.minor) the guests boot.
const (
	// DefaultKernelSeries is what every VM test boots unless it asks for another: Debian
	// 12's kernel (linux-image-amd64).
	DefaultKernelSeries = "6.1"
	// UblkKernelSeries is what the ublk tests boot: Debian 12's 6.1 is built without ublk;
	// its 6.12 (linux-image-6.12-amd64, bookworm-security) has ublk_drv as a module, but no
	// UBLK_U_CMD_UPDATE_SIZE (6.16).
	UblkKernelSeries = "6.12"
	// NewestKernelSeries is the newest kernel the harness boots: Debian trixie-backports'
	// NEWEST_KERNEL_VERSION of hack/versions.sh (TestNewestKernelPinned ties the two),
	// unpacked by hack/install-deps.sh into CachedKernelDir, never installed on the host.
	// Its ublk_drv has online resize, zero copy, per-I/O daemons and batched commands.
	NewestKernelSeries = "7.3"
)

// Kernel is a distribution kernel the guest boots: installed on the host, or unpacked into
// the cache.
type Kernel struct {
	// Version is the kernel release, e.g. "6.1.0-57-amd64" (uname -r in the guest).
	Version string
	// Image is the path of the bzImage, e.g. /boot/vmlinuz-6.1.0-57-amd64.
	Image string
	// ModulesDir is <Root>/lib/modules/<Version>.
	ModulesDir string
	// Root is the directory that holds lib/modules/<Version> for a kernel unpacked into the
	// cache (the host's modprobe -d and depmod -b base), "" for the host's own /lib/modules.
	// The guest then sees ModulesDir at /lib/modules/<Version> (a bind mount).
	Root string
}

// FindKernel returns the kernel the VM tests boot by default: the newest kernel of
// DefaultKernelSeries that has a modules directory, else the newest of any series.
// RAID10_VM_KERNEL=/boot/vmlinuz-<kver> (or <cache>/kernel-<kver>/vmlinuz) selects one
// explicitly.
func FindKernel() (Kernel, error) { return FindKernelSeries("") }

// CachedKernelDir is where hack/install-deps.sh unpacks kernel release kver:
// ${RAID10_CACHE:-$HOME/.cache/raid10-csi}/kernel-<kver>, holding vmlinuz and
// lib/modules/<kver>.
func CachedKernelDir(kver string) string { return filepath.Join(cacheBase(), "kernel-"+kver) }

// cachedKernel describes the kernel unpacked in dir (a CachedKernelDir).
func cachedKernel(dir string) Kernel {
	ver := strings.TrimPrefix(filepath.Base(dir), "kernel-")
	return Kernel{Version: ver, Image: filepath.Join(dir, "vmlinuz"), ModulesDir: filepath.Join(dir, "lib", "modules", ver), Root: dir}
}

// hostKernel describes the host's kernel of bzImage img (/boot/vmlinuz-<kver>), or the
// cached one when img is a CachedKernelDir's vmlinuz.
func hostKernel(img string) Kernel {
	if filepath.Base(img) == "vmlinuz" && strings.HasPrefix(filepath.Base(filepath.Dir(img)), "kernel-") {
		return cachedKernel(filepath.Dir(img))
	}
	ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
	return Kernel{Version: ver, Image: img, ModulesDir: filepath.Join("/lib/modules", ver)}
}

// FindKernelSeries returns the newest kernel of series ("6.12": releases 6.12 and
// 6.12.x) that has a modules directory, from /boot and the cache (CachedKernelDir);
// series "" is FindKernel's choice. RAID10_VM_KERNEL, when it names a kernel of that
// series (or series is ""), wins.
func FindKernelSeries(series string) (Kernel, error) {
	if img := os.Getenv("RAID10_VM_KERNEL"); img != "" {
		k := hostKernel(img)
		if series == "" || inSeries(k.Version, series) {
			if err := k.check(); err != nil {
				return Kernel{}, fmt.Errorf("vm: RAID10_VM_KERNEL=%s: %w", img, err)
			}
			return k, nil
		}
	}
	images, _ := filepath.Glob("/boot/vmlinuz-*")
	cached, _ := filepath.Glob(filepath.Join(cacheBase(), "kernel-*", "vmlinuz"))
	var found, def []Kernel
	for _, img := range append(images, cached...) {
		k := hostKernel(img)
		if k.check() != nil {
			continue
		}
		if series != "" && !inSeries(k.Version, series) {
			continue
		}
		found = append(found, k)
		if inSeries(k.Version, DefaultKernelSeries) {
			def = append(def, k)
		}
	}
	if series == "" && len(def) > 0 {
		found = def
	}
	if len(found) == 0 {
		switch series {
		case "":
			return Kernel{}, ErrNoKernel
		case NewestKernelSeries:
			return Kernel{}, fmt.Errorf("%w: none of series %s (hack/install-deps.sh unpacks NEWEST_KERNEL_VERSION of hack/versions.sh into %s)",
				ErrNoKernel, series, CachedKernelDir("<version>"))
		}
		return Kernel{}, fmt.Errorf("%w: none of series %s (Debian: linux-image-%s-amd64)", ErrNoKernel, series, series)
	}
	sort.Slice(found, func(i, j int) bool { return versionLess(found[i].Version, found[j].Version) })
	return found[len(found)-1], nil
}

// inSeries reports whether kernel release ver belongs to series: "6.1.0-57-amd64" is in
// "6.1", not in "6.12"; "6.12.117+deb12-amd64" is in "6.12".
func inSeries(ver, series string) bool {
	rest, ok := strings.CutPrefix(ver, series)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '-' || rest[0] == '+')
}

func (k Kernel) check() error {
	f, err := os.Open(k.Image)
	if err != nil {
		return err
	}
	_ = f.Close()
	if _, err := os.Stat(filepath.Join(k.ModulesDir, "modules.dep")); err != nil {
		return err
	}
	return nil
}

// versionLess compares kernel releases like `sort -V`: runs of digits numerically.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		ad, bd := isDigit(a[0]), isDigit(b[0])
		if ad && bd {
			na, ra := leadingRun(a, true)
			nb, rb := leadingRun(b, true)
			ia, _ := strconv.Atoi(na)
			ib, _ := strconv.Atoi(nb)
			if ia != ib {
				return ia < ib
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func leadingRun(s string, digits bool) (string, string) {
	i := 0
	for i < len(s) && isDigit(s[i]) == digits {
		i++
	}
	return s[:i], s[i:]
}

// moduleDeps returns the .ko paths (host paths) needed to load mods into kernel k, in load
// order, as `modprobe [-d <k.Root>] -S <kver> --show-depends` prints them. Built-in modules
// are skipped; module options from /etc/modprobe.d are dropped (the guest passes its own).
func moduleDeps(ctx context.Context, k Kernel, mods ...string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, m := range mods {
		args := []string{"-S", k.Version, "--show-depends", m}
		if k.Root != "" {
			args = append([]string{"-d", k.Root}, args...)
		}
		cmd := exec.CommandContext(ctx, "modprobe", args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("vm: modprobe %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 || f[0] != "insmod" {
				continue // "builtin <name>" or noise
			}
			if !seen[f[1]] {
				seen[f[1]] = true
				out = append(out, f[1])
			}
		}
	}
	return out, nil
}

// xenElfNotePhys32Entry is the ELF note type of the PVH entry point.
const xenElfNotePhys32Entry = 18

// BootImage returns the image QEMU should boot for k: the uncompressed vmlinux,
// extracted once from the bzImage into the cache, when the kernel has a PVH entry
// point (CONFIG_PVH) — under TCG that saves the guest ~10 s of decompressing
// itself; otherwise the bzImage.
func BootImage(ctx context.Context, k Kernel) string {
	p, err := extractVmlinux(ctx, k)
	if err != nil {
		return k.Image
	}
	return p
}

func extractVmlinux(ctx context.Context, k Kernel) (string, error) {
	bz, err := os.ReadFile(k.Image)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(bz)
	dir := CacheDir()
	out := filepath.Join(dir, fmt.Sprintf("vmlinux-%s-%s", k.Version, hex.EncodeToString(sum[:])[:16]))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	// The payload is the first stream with a known magic; decompressors are told
	// to stop after one stream (the bzImage has trailing data).
	type codec struct {
		magic []byte
		argv  []string
	}
	for _, c := range []codec{
		{[]byte("\xfd7zXZ\x00"), []string{"xz", "-dc", "--single-stream"}},
		{[]byte("\x28\xb5\x2f\xfd"), []string{"zstd", "-dc"}},
		{[]byte("\x1f\x8b\x08"), []string{"gzip", "-dc"}},
	} {
		i := bytes.Index(bz, c.magic)
		if i < 0 {
			continue
		}
		cmd := exec.CommandContext(ctx, c.argv[0], c.argv[1:]...)
		cmd.Stdin = bytes.NewReader(bz[i:])
		raw, _ := cmd.Output() // trailing data makes some exit non-zero; the ELF check decides
		if !hasPVHNote(raw) {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		return out, writeFileAtomic(out, raw)
	}
	return "", errors.New("vm: no PVH vmlinux in " + k.Image)
}

// hasPVHNote reports whether raw is an ELF image with a Xen PVH entry note.
func hasPVHNote(raw []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(raw))
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			continue
		}
		for len(b) >= 12 {
			namesz := binary.LittleEndian.Uint32(b[0:])
			descsz := binary.LittleEndian.Uint32(b[4:])
			typ := binary.LittleEndian.Uint32(b[8:])
			off := 12 + align4(namesz)
			end := off + align4(descsz)
			if uint64(end) > uint64(len(b)) {
				break
			}
			if typ == xenElfNotePhys32Entry && bytes.HasPrefix(b[12:12+namesz], []byte("Xen")) {
				return true
			}
			b = b[end:]
		}
	}
	return false
}

func align4(n uint32) uint32 { return (n + 3) &^ 3 }

// writeFileAtomic writes data to a temporary file beside p and renames it: a
// concurrent reader sees the old file or the whole new one.
func writeFileAtomic(p string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+"-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // fails once renamed: fine
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}
