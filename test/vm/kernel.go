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

// ErrNoKernel is returned when no /boot/vmlinuz-<kver> with a matching
// /lib/modules/<kver> directory exists on the host.
var ErrNoKernel = errors.New("vm: no kernel found (need /boot/vmlinuz-<kver> and /lib/modules/<kver>; run `make deps`)")

// Kernel series (major.minor) the guests boot.
const (
	// DefaultKernelSeries is what every VM test boots unless it asks for another: Debian
	// 12's kernel (linux-image-amd64).
	DefaultKernelSeries = "6.1"
	// UblkKernelSeries is what the ublk tests boot: Debian 12's 6.1 is built without ublk;
	// its 6.12 (linux-image-6.12-amd64, bookworm-security) has ublk_drv as a module.
	UblkKernelSeries = "6.12"
)

// Kernel is a host-installed distribution kernel the guest boots.
type Kernel struct {
	// Version is the kernel release, e.g. "6.1.0-57-amd64" (uname -r in the guest).
	Version string
	// Image is the path of the bzImage, e.g. /boot/vmlinuz-6.1.0-57-amd64.
	Image string
	// ModulesDir is /lib/modules/<Version>.
	ModulesDir string
}

// FindKernel returns the kernel the VM tests boot by default: the newest kernel of
// DefaultKernelSeries under /boot that has a modules directory, else the newest of any
// series. RAID10_VM_KERNEL=/boot/vmlinuz-<kver> selects one explicitly.
func FindKernel() (Kernel, error) { return FindKernelSeries("") }

// FindKernelSeries returns the newest kernel of series ("6.12": releases 6.12 and
// 6.12.x) under /boot that has a modules directory; series "" is FindKernel's choice.
// RAID10_VM_KERNEL, when it names a kernel of that series (or series is ""), wins.
func FindKernelSeries(series string) (Kernel, error) {
	if img := os.Getenv("RAID10_VM_KERNEL"); img != "" {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		if series == "" || inSeries(ver, series) {
			k := Kernel{Version: ver, Image: img, ModulesDir: filepath.Join("/lib/modules", ver)}
			if err := k.check(); err != nil {
				return Kernel{}, fmt.Errorf("vm: RAID10_VM_KERNEL=%s: %w", img, err)
			}
			return k, nil
		}
	}
	images, _ := filepath.Glob("/boot/vmlinuz-*")
	var found, def []Kernel
	for _, img := range images {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		k := Kernel{Version: ver, Image: img, ModulesDir: filepath.Join("/lib/modules", ver)}
		if k.check() != nil {
			continue
		}
		if series != "" && !inSeries(ver, series) {
			continue
		}
		found = append(found, k)
		if inSeries(ver, DefaultKernelSeries) {
			def = append(def, k)
		}
	}
	if series == "" && len(def) > 0 {
		found = def
	}
	if len(found) == 0 {
		if series != "" {
			return Kernel{}, fmt.Errorf("%w: none of series %s (Debian: linux-image-%s-amd64)", ErrNoKernel, series, series)
		}
		return Kernel{}, ErrNoKernel
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

// moduleDeps returns the .ko paths (host paths) needed to load mods, in load order,
// as `modprobe -S <kver> --show-depends` prints them. Built-in modules are skipped;
// module options from /etc/modprobe.d are dropped (the guest passes its own).
func moduleDeps(ctx context.Context, kver string, mods ...string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, m := range mods {
		cmd := exec.CommandContext(ctx, "modprobe", "-S", kver, "--show-depends", m)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("vm: modprobe -S %s --show-depends %s: %w: %s", kver, m, err, strings.TrimSpace(stderr.String()))
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
