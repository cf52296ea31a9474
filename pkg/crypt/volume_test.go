package crypt

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestVolumeOpen: a volume's mapping counts as open when its device node exists in the
// mapper directory; a regular file there or no node at all does not.
func TestVolumeOpen(t *testing.T) {
	dir := t.TempDir()
	if VolumeOpen(dir, "vol-1") {
		t.Fatal("VolumeOpen without a node = true")
	}
	if err := os.WriteFile(filepath.Join(dir, MapperName("vol-2")), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if VolumeOpen(dir, "vol-2") {
		t.Fatal("VolumeOpen over a regular file = true")
	}
	MknodForTest(t, filepath.Join(dir, MapperName("vol-1")))
	if !VolumeOpen(dir, "vol-1") {
		t.Fatal("VolumeOpen over a device node = false")
	}
}

// MknodForTest makes a character device node (the null device's numbers) at path; it needs
// root, else the test skips.
func MknodForTest(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mknod(path, syscall.S_IFCHR|0o600, 1<<8|3); err != nil {
		t.Skipf("mknod %s (needs root): %v", path, err)
	}
}
