package pool

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestRestoreFromFailingSnapshot: a volume restored from a snapshot whose own copy is still
// running, and then fails (the writes of the snapshot's copy record fail on both its
// members), ends Failed with the reason given, never Hydrated: the regions the snapshot
// never got are not lost media but data the restore can never have. Without it the
// restore records them as lost blocks and ends Hydrated with EIO holes.
func TestRestoreFromFailingSnapshot(t *testing.T) {
	p, fs := faultyPool(t, 6, func(c *Config) { c.RebuildRateMax = 4 << 20 })
	defer p.Close()
	const size = 16 << 20
	if _, err := p.CreateVolume("v", size, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, p, "v", randBytes(size), 0)
	if _, err := p.CreateSnapshot("s", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVolume("r", size, CreateOptions{Members: 2, Source: &Source{Snapshot: "s"}}); err != nil {
		t.Fatal(err)
	}
	if len(*fs) != 6 {
		t.Fatalf("test set-up: %d faulty members, want 2 each for v, s, r", len(*fs))
	}
	// The snapshot's two members (created after v's) mirror its whole array after the
	// engine's head: its copy record's bitmap blocks follow its data.
	bitmap := int64(extentMetaSize) + size + 2*4096
	for _, f := range (*fs)[2:4] {
		f.FailRange(bitmap, raid10.CopyRecordSize-2*4096, false, true)
	}
	var vi VolumeInfo
	waitUntil(t, time.Minute, func() (bool, string) {
		vi = volumeInfo(t, p, "r")
		return vi.Health == Failed || vi.Hydrated, fmt.Sprintf("restore neither failed nor hydrated: %+v", vi)
	})
	si, err := p.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %s, %q; restore: %s, hydrated %v, lost %d, %q", si.Health, si.Reason, vi.Health, vi.Hydrated, vi.LostBlocks, vi.Reason)
	if si.Health != Failed {
		t.Fatalf("test set-up: the snapshot's copy did not fail: %+v", si)
	}
	if vi.Hydrated || vi.Health != Failed || vi.LostBlocks != 0 || !strings.Contains(vi.Reason, "failed") {
		t.Fatalf("restore from a snapshot whose copy failed: %+v: want Failed with the reason, no lost blocks, not hydrated", vi)
	}
	checkNotServed(t, p, "r", "its own copy failed")
	for _, f := range *fs {
		f.ClearFaults()
	}
	if err := p.DeleteVolume("r"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot("s"); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreResumesOnlyFromWholeSource: at Open, a restore whose copy was running from a
// snapshot whose own copy was running too resumes only from a snapshot that holds its
// data (its copy resumed, or done); the snapshot has no hook to fill what it lacks, so
// reading it would copy whatever its extents hold.
//   - SourceCopyFailed: the snapshot's failure is in its labels (the pool recorded it;
//     the restore had not met it yet): the restore is Failed, with the reason.
//   - SourceCopyStopped: the volume's disks are absent, so the snapshot's copy cannot
//     resume: the restore stays stopped (not served); when the disks come back both
//     copies resume, and the restore ends holding the volume's data.
//
// Without it the restore resumed from the snapshot's unfilled extents and ended Hydrated
// with zeroes where the volume's data belonged.
func TestRestoreResumesOnlyFromWholeSource(t *testing.T) {
	const size = 16 << 20
	for _, failed := range []bool{true, false} {
		name := "SourceCopyStopped"
		if failed {
			name = "SourceCopyFailed"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			paths := makeDisks(t, dir, 8, 64<<20)
			slow := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}, RebuildRateMax: 1 << 20}
			p := openPool(t, slow)
			defer func() { p.Close() }()
			if _, err := p.CreateVolume("v", size, CreateOptions{Members: 3}); err != nil {
				t.Fatal(err)
			}
			data := randBytes(size)
			writeVolume(t, p, "v", data, 0)
			if _, err := p.CreateSnapshot("s", "v"); err != nil {
				t.Fatal(err)
			}
			if _, err := p.CreateVolume("r", size, CreateOptions{Members: 2, Source: &Source{Snapshot: "s"}}); err != nil {
				t.Fatal(err)
			}
			vDisks := diskPathsOf(t, p, "v")
			for _, other := range append(diskPathsOf(t, p, "s"), diskPathsOf(t, p, "r")...) {
				if slices.Contains(vDisks, other) {
					t.Fatalf("test set-up: the volume shares disk %s with its snapshot or restore", other)
				}
			}
			if failed {
				p.mu.Lock()
				fail := p.onCopyFail(p.snaps["s"])
				p.mu.Unlock()
				fail(errors.New("injected: the snapshot's copy failed"))
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			fast := Config{Disks: slow.Disks, RebuildRateMax: 64 << 20}
			if failed {
				p = openPool(t, fast)
				vi := volumeInfo(t, p, "r")
				if vi.Health != Failed || vi.Hydrated || !strings.Contains(vi.Reason, "its own copy failed") {
					t.Fatalf("restore whose source's copy failed: %+v: want Failed saying why", vi)
				}
				checkNotServed(t, p, "r", "its own copy failed")
				return
			}
			var keep []string
			for _, path := range paths {
				if !slices.Contains(vDisks[:2], path) {
					keep = append(keep, path)
				}
			}
			p = openPool(t, Config{Disks: configFor(keep...).Disks, RebuildRateMax: fast.RebuildRateMax})
			checkNotServed(t, p, "r", "stopped")
			for _, path := range vDisks[:2] {
				if _, err := p.AddDisk(DiskConfig{Path: path}); err != nil {
					t.Fatal(err)
				}
			}
			waitSnapshotReady(t, p, "s")
			waitHydrated(t, p, "r")
			checkVolume(t, p, "r", data, 0)
			if !bytes.Equal(readArray(t, snapArray(t, p, "s"), size), data) {
				t.Fatal("snapshot does not hold the volume's data")
			}
		})
	}
}
