package vm

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// TestNewestKernelPinned ties NewestKernelSeries to the release hack/install-deps.sh
// fetches (NEWEST_KERNEL_VERSION of hack/versions.sh): a new pin of another series must
// move the constant too, or the tests that ask for the series would not find the kernel.
func TestNewestKernelPinned(t *testing.T) {
	b, err := os.ReadFile("../../hack/versions.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^NEWEST_KERNEL_VERSION=(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("hack/versions.sh has no NEWEST_KERNEL_VERSION=<release>")
	}
	if ver := string(m[1]); !inSeries(ver, NewestKernelSeries) {
		t.Errorf("NEWEST_KERNEL_VERSION=%s is not of NewestKernelSeries %s", ver, NewestKernelSeries)
	}
}

// fakeCachedKernel lays out a kernel of release ver in the cache as hack/install-deps.sh
// does: kernel-<ver>/vmlinuz and kernel-<ver>/lib/modules/<ver>/modules.dep.
func fakeCachedKernel(t *testing.T, ver string) string {
	t.Helper()
	dir := CachedKernelDir(ver)
	if err := os.MkdirAll(filepath.Join(dir, "lib", "modules", ver), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"vmlinuz", filepath.Join("lib", "modules", ver, "modules.dep")} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestFindCachedKernel: a kernel unpacked into the cache is found by its series (newest
// first), with Root set for modprobe -d; RAID10_VM_KERNEL may name its vmlinuz; a series
// with none is ErrNoKernel naming hack/install-deps.sh.
func TestFindCachedKernel(t *testing.T) {
	t.Setenv("RAID10_CACHE", t.TempDir())
	t.Setenv("RAID10_VM_KERNEL", "")
	old := fakeCachedKernel(t, "7.3.2+deb13-amd64")
	dir := fakeCachedKernel(t, "7.3.4+deb13-amd64")
	k, err := FindKernelSeries(NewestKernelSeries)
	if err != nil {
		t.Fatal(err)
	}
	want := Kernel{Version: "7.3.4+deb13-amd64", Image: filepath.Join(dir, "vmlinuz"),
		ModulesDir: filepath.Join(dir, "lib/modules/7.3.4+deb13-amd64"), Root: dir}
	if k != want {
		t.Errorf("FindKernelSeries(%s) = %+v, want %+v", NewestKernelSeries, k, want)
	}
	t.Setenv("RAID10_VM_KERNEL", filepath.Join(old, "vmlinuz"))
	if k, err := FindKernelSeries(NewestKernelSeries); err != nil || k.Version != "7.3.2+deb13-amd64" || k.Root != old {
		t.Errorf("with RAID10_VM_KERNEL: %+v, %v", k, err)
	}
	t.Setenv("RAID10_VM_KERNEL", "")
	if _, err := FindKernelSeries("7.9"); !errors.Is(err, ErrNoKernel) {
		t.Errorf("series 7.9: %v, want ErrNoKernel", err)
	}
	if err := os.RemoveAll(filepath.Join(old, "lib")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "lib")); err != nil {
		t.Fatal(err)
	}
	_, err = FindKernelSeries(NewestKernelSeries)
	if !errors.Is(err, ErrNoKernel) || !strings.Contains(err.Error(), "hack/install-deps.sh") {
		t.Errorf("without modules: %v, want ErrNoKernel naming hack/install-deps.sh", err)
	}
}

// TestRunFilesCachedKernel: the guest binds a cached kernel's modules at
// /lib/modules/<release>, after the shares; a host kernel needs no bind.
func TestRunFilesCachedKernel(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    Kernel
		want string
	}{
		{"cached", Kernel{Version: "7.3.4+deb13-amd64", ModulesDir: "/c/kernel-7.3.4+deb13-amd64/lib/modules/7.3.4+deb13-amd64", Root: "/c/kernel-7.3.4+deb13-amd64"},
			"\tvm_kernel_modules '/c/kernel-7.3.4+deb13-amd64/lib/modules/7.3.4+deb13-amd64' '7.3.4+deb13-amd64'\n"},
		{"host", Kernel{Version: "6.1.0-57-amd64", ModulesDir: "/lib/modules/6.1.0-57-amd64"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := writeRunFiles(dir, Options{Dir: "/work", Writable: []string{"/work/w"}, Modules: []string{"nbd"}}, tc.k, "true"); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(dir, "config.sh"))
			if err != nil {
				t.Fatal(err)
			}
			c := string(b)
			i := strings.Index(c, "vm_kernel_modules")
			switch {
			case tc.want == "" && i >= 0:
				t.Errorf("config.sh binds modules for a host kernel:\n%s", c)
			case tc.want != "" && !strings.Contains(c, tc.want):
				t.Errorf("config.sh lacks %q:\n%s", tc.want, c)
			case tc.want != "" && (i < strings.Index(c, "vm_share") || i > strings.Index(c, "vm_modprobe")):
				t.Errorf("config.sh binds the modules outside shares..modprobe:\n%s", c)
			}
		})
	}
}

// TestNewestKernelModules: the kernel hack/install-deps.sh unpacked resolves, with the
// host's modprobe over its own modules.dep (xz-compressed modules), the modules the VM
// tests load: the initramfs's 9p and virtio ones, nbd, ublk_drv, raid10, brd.
func TestNewestKernelModules(t *testing.T) {
	k, err := FindKernelSeries(NewestKernelSeries)
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	if k.Root == "" {
		t.Skipf("the %s kernel is installed on the host (%s), not unpacked into the cache", NewestKernelSeries, k.Image)
	}
	for _, m := range append(append([]string{}, bootModules...), "nbd", "ublk_drv", "raid10", "brd", "ext4") {
		kos, err := moduleDeps(t.Context(), k, m)
		if err != nil {
			t.Errorf("%s: %v", m, err)
			continue
		}
		for _, ko := range kos {
			if !strings.HasPrefix(ko, k.ModulesDir+"/") {
				t.Errorf("%s: module %s is not the kernel's own (%s)", m, ko, k.ModulesDir)
			}
		}
		t.Logf("%s: %d modules", m, len(kos))
	}
	data, name, err := readModule(t.Context(), filepath.Join(k.ModulesDir, "kernel/drivers/block/ublk_drv.ko.xz"))
	if err != nil || name != "ublk_drv.ko" || !strings.HasPrefix(string(data), "\x7fELF") {
		t.Errorf("ublk_drv.ko.xz: %s, %d bytes, %v; want an ELF ublk_drv.ko", name, len(data), err)
	}
}
