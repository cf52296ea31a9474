package driver

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// healthPlugin is a --mode=all plugin over a pool of real file disks, reached through a
// gRPC client on its unix socket: the node service reads the pool, the controller the
// LocalStore's status made from it.
type healthPlugin struct {
	p  *pool.Pool
	cc csi.ControllerClient
	nc csi.NodeClient
}

// startHealthPlugin opens the pool of cfg and serves it until t ends.
func startHealthPlugin(t *testing.T, cfg pool.Config, records string) *healthPlugin {
	t.Helper()
	p, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	cc, _, nc := startAllMode(t, openLocalStore(t, p, records))
	return &healthPlugin{p: p, cc: cc, nc: nc}
}

// volume is the node's and the controller's VolumeHealth of id, which must agree on the
// (status, reason) pairs.
func (h *healthPlugin) volume(t *testing.T, id string) (node *csi.VolumeHealth, entries []healthEntry) {
	t.Helper()
	nr, err := h.nc.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		t.Fatalf("NodeGetVolumeHealth(%s): %v", id, err)
	}
	cr, err := h.cc.ControllerGetVolumeHealth(t.Context(), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		t.Fatalf("ControllerGetVolumeHealth(%s): %v", id, err)
	}
	ne, ce := entriesOf(t, nr.GetVolumeHealth()), entriesOf(t, cr.GetVolumeHealth())
	if !slices.Equal(ne, ce) {
		t.Fatalf("node says %v, controller %v", nr, cr)
	}
	return nr.GetVolumeHealth(), ne
}

// storage is NodeGetStorageHealth's entries by reason.
func (h *healthPlugin) storage(t *testing.T) map[string]*csi.NodeGetStorageHealthResponse_StorageBackendHealth {
	t.Helper()
	resp, err := h.nc.NodeGetStorageHealth(t.Context(), &csi.NodeGetStorageHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*csi.NodeGetStorageHealthResponse_StorageBackendHealth{}
	for _, b := range resp.GetBackendHealth() {
		if out[b.GetReason()] != nil || len(b.GetMessage()) > MaxHealthMessage {
			t.Fatalf("storage entry %v repeated or over %d bytes", b, MaxHealthMessage)
		}
		out[b.GetReason()] = b
	}
	return out
}

// waitHealth polls the volume's health until ok accepts it (60 s).
func (h *healthPlugin) waitHealth(t *testing.T, id, what string, ok func(*csi.VolumeHealth, []healthEntry) bool) *csi.VolumeHealth {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		vh, e := h.volume(t, id)
		if ok(vh, e) {
			return vh
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: volume health still %v after 60 s", what, vh)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// filePoolConfig is a pool over n sparse files of size bytes in dir, rebuilding at rate
// bytes per second. The member deadline is off: on a loaded machine a file's write can
// stall for seconds in the page cache's dirty throttling, and a stalled last copy is
// counted (MemberStatus.SlowLastCopy) and reported as DiskErrors for as long as the pool
// runs, an entry these tests do not expect (the deadline has its own tests in pkg/raid10).
func filePoolConfig(t *testing.T, dir string, n int, size, rate int64) pool.Config {
	cfg := pool.Config{RebuildRateMax: rate, MemberTimeout: -1}
	for _, path := range vm.SparseFiles(t, dir, "disk", n, size) {
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: path})
	}
	return cfg
}

// TestVolumeHealthLifecycle: a volume over four real file disks, healthy, Degraded once a
// member's disk fails (the member and its disk named), Rebuilding onto a replacement (the
// progress and ETA), and healthy again after the rebuild; the node and the controller
// agree all along, and NodeGetStorageHealth follows the disk.
func TestVolumeHealthLifecycle(t *testing.T) {
	dir := t.TempDir()
	h := startHealthPlugin(t, filePoolConfig(t, dir, 4, 256<<20, 4<<20), filepath.Join(dir, LocalRecordsFile))
	ctx := t.Context()
	if _, err := h.cc.CreateVolume(ctx, createReq("pvc-h", 64<<20, localNode)); err != nil {
		t.Fatal(err)
	}
	caps, err := h.nc.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil || !strings.Contains(caps.String(), "GET_VOLUME_HEALTH") || !strings.Contains(caps.String(), "GET_STORAGE_HEALTH") {
		t.Fatalf("node capabilities %v, %v: want GET_VOLUME_HEALTH and GET_STORAGE_HEALTH", caps, err)
	}
	ccaps, err := h.cc.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil || !strings.Contains(ccaps.String(), "GET_VOLUME_HEALTH") || !strings.Contains(ccaps.String(), "LIST_VOLUME_HEALTH") {
		t.Fatalf("controller capabilities %v, %v: want GET_VOLUME_HEALTH and LIST_VOLUME_HEALTH", ccaps, err)
	}

	if _, e := h.volume(t, "pvc-h"); len(e) != 0 {
		t.Fatalf("new volume: entries %v, want none", e)
	}
	if s := h.storage(t); len(s) != 0 {
		t.Fatalf("healthy pool: storage entries %v, want none", s)
	}
	_, err = h.nc.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{})
	wantCode(t, err, codes.InvalidArgument, "volume_id")
	_, err = h.nc.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "pvc-none"})
	wantCode(t, err, codes.NotFound, "pvc-none")

	vi, err := h.p.Volume("pvc-h")
	if err != nil {
		t.Fatal(err)
	}
	failed := vi.Members[1].DiskPath
	if err := h.p.FailDisk(failed); err != nil {
		t.Fatal(err)
	}
	vh := h.waitHealth(t, "pvc-h", "after FailDisk", func(_ *csi.VolumeHealth, e []healthEntry) bool {
		return slices.Contains(e, healthEntry{csi.VolumeHealthErrorType_DEGRADED, HealthReasonMemberDown})
	})
	if m := messageOf(vh, HealthReasonMemberDown); !strings.Contains(m, "member 1 Failed on disk "+failed) {
		t.Fatalf("MemberDown message %q: want member 1 and disk %s", m, failed)
	}
	t.Logf("degraded: %v", vh)
	s := h.storage(t)
	if b := s[StorageReasonDiskFailed]; b.GetStatus() != csi.StorageHealthErrorType_STORAGE_DEGRADED || !strings.Contains(b.GetMessage(), failed) {
		t.Fatalf("storage %v: want DiskFailed naming %s", s, failed)
	}
	if b := s[StorageReasonVolumesNotRedundant]; !strings.Contains(b.GetMessage(), "Degraded: pvc-h") {
		t.Fatalf("storage %v: want pvc-h Degraded", s)
	}
	listed := listHealth(t, h.cc, 0)
	if len(listed) != 1 || listed[0].GetVolumeId() != "pvc-h" {
		t.Fatalf("ControllerListVolumeHealth %v: want pvc-h alone", listed)
	}

	replacement := vm.SparseFiles(t, dir, "new", 1, 256<<20)[0]
	if _, err := h.p.ReplaceDisk(failed, pool.DiskConfig{Path: replacement}); err != nil {
		t.Fatal(err)
	}
	vh = h.waitHealth(t, "pvc-h", "rebuilding with an ETA", func(vh *csi.VolumeHealth, e []healthEntry) bool {
		m := messageOf(vh, HealthReasonRebuilding)
		return strings.Contains(m, "ETA") && !strings.Contains(m, " 0% ")
	})
	if m := messageOf(vh, HealthReasonRebuilding); !strings.Contains(m, "member 1 on disk "+replacement) || !strings.Contains(m, "bytes/s") {
		t.Fatalf("Rebuilding message %q: want member 1 onto %s with its rate", m, replacement)
	}
	t.Logf("rebuilding: %v", vh)
	h.waitHealth(t, "pvc-h", "after the rebuild", func(_ *csi.VolumeHealth, e []healthEntry) bool { return len(e) == 0 })
	if s := h.storage(t); len(s) != 0 {
		t.Fatalf("after the rebuild: storage entries %v, want none (the failed disk is Removed)", s)
	}
	if listed := listHealth(t, h.cc, 0); len(listed) != 0 {
		t.Fatalf("after the rebuild: ControllerListVolumeHealth %v, want none", listed)
	}
}

// TestVolumeHealthFailedAndMissing: both disks of a mirror pair gone at a restart leave the
// volume Failed (INACCESSIBLE, saying why it did not assemble) and the pool reporting them
// missing (by pool UUID) and their paths refused; one disk of the other pair failing makes
// the pool unusable (STORAGE_UNREACHABLE).
func TestVolumeHealthFailedAndMissing(t *testing.T) {
	dir := t.TempDir()
	cfg := filePoolConfig(t, dir, 4, 128<<20, 0)
	records := filepath.Join(dir, LocalRecordsFile)
	var gone, uuids []string
	t.Run("Create", func(t *testing.T) {
		h := startHealthPlugin(t, cfg, records)
		if _, err := h.cc.CreateVolume(t.Context(), createReq("pvc-f", 32<<20, localNode)); err != nil {
			t.Fatal(err)
		}
		vi, err := h.p.Volume("pvc-f")
		if err != nil {
			t.Fatal(err)
		}
		gone = []string{vi.Members[0].DiskPath, vi.Members[1].DiskPath} // mirrors of each other
		uuids = []string{vi.Members[0].DiskUUID, vi.Members[1].DiskUUID}
	})
	for _, path := range gone {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	h := startHealthPlugin(t, cfg, records)
	vh, e := h.volume(t, "pvc-f")
	if !slices.Equal(e, []healthEntry{{csi.VolumeHealthErrorType_INACCESSIBLE, HealthReasonVolumeFailed}}) ||
		!strings.Contains(messageOf(vh, HealthReasonVolumeFailed), "no in-sync member among slots [0 1]") {
		t.Fatalf("entries %v: want INACCESSIBLE VolumeFailed alone, saying which slots have no copy", vh)
	}
	t.Logf("failed: %v", vh)
	s := h.storage(t)
	for i, path := range gone {
		if !strings.Contains(s[StorageReasonDiskMissing].GetMessage(), uuids[i]) || !strings.Contains(s[StorageReasonDiskFailed].GetMessage(), path+" Refused") {
			t.Fatalf("storage %v: want DiskMissing naming %s and DiskFailed refusing %s", s, uuids[i], path)
		}
	}
	if !strings.Contains(s[StorageReasonVolumesNotRedundant].GetMessage(), "Failed: pvc-f") || s[StorageReasonPoolUnusable] != nil {
		t.Fatalf("storage %v: want pvc-f Failed, the pool usable", s)
	}
	var other string
	for _, d := range cfg.Disks {
		if !slices.Contains(gone, d.Path) {
			other = d.Path
		}
	}
	if err := h.p.FailDisk(other); err != nil {
		t.Fatal(err)
	}
	s = h.storage(t)
	if b := s[StorageReasonPoolUnusable]; b.GetStatus() != csi.StorageHealthErrorType_STORAGE_UNREACHABLE {
		t.Fatalf("storage %v: want STORAGE_UNREACHABLE with one active disk", s)
	}
	t.Logf("storage: %v", s)
}
