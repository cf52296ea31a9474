package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
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

// Kernel is a host-installed distribution kernel the guest boots.
type Kernel struct {
	// Version is the kernel release, e.g. "6.1.0-57-amd64" (uname -r in the guest).
	Version string
	// Image is the path of the bzImage, e.g. /boot/vmlinuz-6.1.0-57-amd64.
	Image string
	// ModulesDir is /lib/modules/<Version>.
	ModulesDir string
}

// FindKernel returns the newest kernel under /boot that has a modules directory.
// RAID10_VM_KERNEL=/boot/vmlinuz-<kver> selects one explicitly.
func FindKernel() (Kernel, error) {
	if img := os.Getenv("RAID10_VM_KERNEL"); img != "" {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		k := Kernel{Version: ver, Image: img, ModulesDir: filepath.Join("/lib/modules", ver)}
		if err := k.check(); err != nil {
			return Kernel{}, fmt.Errorf("vm: RAID10_VM_KERNEL=%s: %w", img, err)
		}
		return k, nil
	}
	images, _ := filepath.Glob("/boot/vmlinuz-*")
	var found []Kernel
	for _, img := range images {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		k := Kernel{Version: ver, Image: img, ModulesDir: filepath.Join("/lib/modules", ver)}
		if k.check() == nil {
			found = append(found, k)
		}
	}
	if len(found) == 0 {
		return Kernel{}, ErrNoKernel
	}
	sort.Slice(found, func(i, j int) bool { return versionLess(found[i].Version, found[j].Version) })
	return found[len(found)-1], nil
}

func (k Kernel) check() error {
	f, err := os.Open(k.Image)
	if err != nil {
		return err
	}
	f.Close()
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
			return nil, fmt.Errorf("vm: modprobe -S %s --show-depends %s: %v: %s", kver, m, err, strings.TrimSpace(stderr.String()))
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
