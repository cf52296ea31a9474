package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// writeArray writes n random bytes at off of the pool volume name through its array (the
// engine's I/O path, as the NBD server uses it) and returns them.
func writeArray(t *testing.T, p *pool.Pool, name string, off int64, n int) []byte {
	t.Helper()
	a, err := p.Array(name)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt(b, off); err != nil {
		t.Fatalf("write %s at %d: %v", name, off, err)
	}
	return b
}

// sumArray is the SHA-256 of the first n bytes of pool volume name.
func sumArray(t *testing.T, p *pool.Pool, name string, n int64) [32]byte {
	t.Helper()
	a, err := p.Array(name)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	if _, err := a.ReadAt(b, 0); err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return sha256.Sum256(b)
}

// TestLocalStoreSnapshots runs snapshots, restores and clones of --mode=all over a pool of
// four real file disks: the snapshot holds the data as of the cut while the source is
// written after it; a restore and a clone read back the source's data as of the snapshot and
// of the clone; a snapshot that a restore still copies from is refused with
// FailedPrecondition; the records survive a restart; every delete frees the pool's space.
func TestLocalStoreSnapshots(t *testing.T) {
	p, cfg := openFilePool(t, 256<<20)
	records := filepath.Join(t.TempDir(), LocalRecordsFile)
	s := openLocalStore(t, p, records)
	cc, _, _ := startAllMode(t, s)
	ctx := context.Background()
	const size = 32 << 20
	free := p.Capacity().FreeUsable

	if _, err := cc.CreateVolume(ctx, createReq("pvc-src", size, localNode)); err != nil {
		t.Fatal(err)
	}
	writeArray(t, p, "pvc-src", 0, size)
	atCut := sumArray(t, p, "pvc-src", size)
	snap, err := cc.CreateSnapshot(ctx, snapReq("snapshot-a", "pvc-src"))
	if err != nil {
		t.Fatal(err)
	}
	if snap.GetSnapshot().GetSizeBytes() != size || snap.GetSnapshot().GetCreationTime().AsTime().IsZero() {
		t.Fatalf("CreateSnapshot = %v", snap)
	}
	t.Logf("cut: ready %v at once", snap.GetSnapshot().GetReadyToUse())
	// The source goes on being written after the cut.
	after := writeArray(t, p, "pvc-src", 4<<20, 1<<20)
	var ready *csi.Snapshot
	waitFor(t, func() bool {
		r, err := cc.CreateSnapshot(ctx, snapReq("snapshot-a", "pvc-src"))
		if err != nil {
			t.Fatal(err)
		}
		ready = r.GetSnapshot()
		return ready.GetReadyToUse()
	})
	if !ready.GetCreationTime().AsTime().Equal(snap.GetSnapshot().GetCreationTime().AsTime()) {
		t.Fatalf("creation time moved from %v to %v", snap.GetSnapshot().GetCreationTime().AsTime(), ready.GetCreationTime().AsTime())
	}
	_, err = cc.CreateSnapshot(ctx, snapReq("snapshot-a", "pvc-other"))
	wantCode(t, err, codes.AlreadyExists, "pvc-src")
	_, err = cc.CreateSnapshot(ctx, snapReq("snapshot-b", "pvc-nope"))
	wantCode(t, err, codes.NotFound, "pvc-nope")

	// Restore: the data as of the cut, not the later write.
	if _, err := cc.CreateVolume(ctx, fromSnapshot(createReq("pvc-restore", size, localNode), "snapshot-a")); err != nil {
		t.Fatal(err)
	}
	if got := sumArray(t, p, "pvc-restore", size); got != atCut {
		t.Fatal("restore of snapshot-a does not hold the source's data as of the cut")
	}
	_, err = cc.CreateVolume(ctx, fromSnapshot(createReq("pvc-small", size/2, localNode), "snapshot-a"))
	wantCode(t, err, codes.OutOfRange, "snapshot-a")
	// Clone: the source's data as of the clone's create, later writes to the source stay out.
	nowSrc := sumArray(t, p, "pvc-src", size)
	if _, err := cc.CreateVolume(ctx, fromVolume(createReq("pvc-clone", size, localNode), "pvc-src")); err != nil {
		t.Fatal(err)
	}
	writeArray(t, p, "pvc-src", 0, 1<<20)
	if got := sumArray(t, p, "pvc-clone", size); got != nowSrc {
		t.Fatal("clone of pvc-src does not hold the source's data as of its create")
	}
	a, _ := p.Array("pvc-clone")
	b := make([]byte, len(after))
	if _, err := a.ReadAt(b, 4<<20); err != nil || !bytes.Equal(b, after) {
		t.Fatalf("clone at 4 MiB: %v, want the write made before the clone", err)
	}

	list, err := cc.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: "pvc-src"})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetSnapshot().GetSnapshotId() != "snapshot-a" {
		t.Fatalf("ListSnapshots(pvc-src) = %v, %v", list, err)
	}

	// The records survive a restart of the store (and of the pool).
	p2 := reopenPool(t, p, cfg)
	s2 := openLocalStore(t, p2, records)
	cc2, _, _ := startAllMode(t, s2)
	again, err := cc2.CreateSnapshot(ctx, snapReq("snapshot-a", "pvc-src"))
	if err != nil || !again.GetSnapshot().GetReadyToUse() || !again.GetSnapshot().GetCreationTime().AsTime().Equal(ready.GetCreationTime().AsTime()) {
		t.Fatalf("snapshot-a after a restart = %v, %v; want ready, the same cut", again, err)
	}
	if got := sumArray(t, p2, "pvc-restore", size); got != atCut {
		t.Fatal("restore after a restart does not hold the data as of the cut")
	}

	// Every order of deletes frees everything: the source first, then its snapshot, then
	// what was made from them.
	for _, id := range []string{"pvc-src"} {
		waitFor(t, func() bool {
			_, err := cc2.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			return err == nil
		})
	}
	waitFor(t, func() bool {
		_, err := cc2.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "snapshot-a"})
		return err == nil
	})
	for _, id := range []string{"pvc-restore", "pvc-clone"} {
		waitFor(t, func() bool {
			_, err := cc2.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			return err == nil
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for p2.Capacity().FreeUsable != free && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := p2.Capacity().FreeUsable; got != free || len(p2.Snapshots()) != 0 || len(p2.Volumes()) != 0 {
		t.Fatalf("after the deletes: %d usable bytes free (want %d), snapshots %v, volumes %v", got, free, p2.Snapshots(), p2.Volumes())
	}
}
