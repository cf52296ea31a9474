package cluster

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/ociimage"
	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// TestStateImportOnHost: the host imports the node's images into its state disk with its
// own containerd, as the guest's would (no VM): a fresh disk gets the first image, kept in
// the cache; a second rig starts from the cache's copy and imports only the image the disk's
// record lacks (the cache's list, emptied, does not decide).
// Each time containerd, started again on the disk, lists the images unpacked for the
// overlayfs snapshotter and node.sh's record names every image, so the guest imports none.
func TestStateImportOnHost(t *testing.T) {
	for _, tool := range []string{"containerd", "ctr", "mkfs.ext4", "mount"} {
		testenv.Tool(t, tool, "run `make deps` (hack/install-deps.sh)")
	}
	dir, cache := t.TempDir(), t.TempDir()
	image := func(name, content string) string {
		bin := filepath.Join(dir, name+".bin")
		if err := os.WriteFile(bin, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		img, err := ociimage.BinaryImage(bin, "/"+name)
		if err != nil {
			t.Fatal(err)
		}
		tar := filepath.Join(dir, name+".tar")
		if err := ociimage.Write(img, "rig.test/"+name+":1", tar); err != nil {
			t.Fatal(err)
		}
		return tar
	}
	a, b := image("a", "first image"), image("b", "second image")

	rig := func(images ...string) *Rig {
		rd := t.TempDir()
		r := &Rig{t: t, Dir: rd, state: filepath.Join(rd, "state.img"), cfg: Config{StateSize: 128 << 20, Images: images}}
		if err := r.prepareState(cache); err != nil {
			t.Fatal(err)
		}
		if r.hostImported != 1 {
			t.Fatalf("the host imported %d images, want the one the cache lacks", r.hostImported)
		}
		return r
	}
	check := func(r *Rig, want ...string) {
		t.Helper()
		err := onStateDisk(r.state, filepath.Join(r.Dir, "check-containerd.log"), func(ctr ctrFunc, varLib string) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := ctr(ctx, "images", "ls", "-q")
			if err != nil {
				t.Fatalf("ctr images ls: %v: %s", err, out)
			}
			for _, w := range want {
				if !slices.Contains(strings.Fields(string(out)), "rig.test/"+w+":1") {
					t.Errorf("image %s not in the state disk's containerd: %q", w, out)
				}
			}
			// Unpacked: the kubelet's containers need the layers as overlayfs snapshots.
			out, err = ctr(ctx, "snapshots", "--snapshotter", "overlayfs", "ls")
			if err != nil {
				t.Fatalf("ctr snapshots ls: %v: %s", err, out)
			}
			if n := len(strings.Split(strings.TrimSpace(string(out)), "\n")) - 1; n != len(want) {
				t.Errorf("%d overlayfs snapshots, want one per image (%d): %s", n, len(want), out)
			}
			rec, err := os.ReadFile(filepath.Join(varLib, "images.imported"))
			if err != nil {
				t.Fatalf("node.sh's record: %v", err)
			}
			if got := strings.Fields(string(rec)); !slices.Equal(got, r.imageSums) {
				t.Errorf("images.imported = %q, want the sums %q", got, r.imageSums)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	first := rig(a)
	check(first, "a")
	listed, err := os.ReadFile(strings.TrimSuffix(first.stateCache, ".img") + ".list")
	if err != nil || strings.TrimSpace(string(listed)) != first.imageSums[0] {
		t.Fatalf("the cache's list %q (%v), want the first image's sum", listed, err)
	}
	// The cache's list only decides whether to mount the disk; what the disk holds is its
	// own record. A list that names nothing still leaves the first image alone.
	if err := os.WriteFile(strings.TrimSuffix(first.stateCache, ".img")+".list", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	second := rig(a, b)
	if second.stateCache != first.stateCache {
		t.Fatalf("the second rig's cache %s, want the first's %s", second.stateCache, first.stateCache)
	}
	check(second, "a", "b")
}
