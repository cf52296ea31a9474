package pool

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCopyTargetNeverServedUnlessWhole: a volume filled from a source (here a restore) is
// never handed out for I/O while it does not hold its source's data, whatever path
// assembles it. Array refuses it with ErrFailedPrecondition naming the volume and why, its
// health is Failed with that reason, and its labels record a failed copy on every disk:
//   - FailedCopyDisksReturn: two of its three disks were absent at Open (not assembled
//     while its copy ran: the copy is failed) and come back through AddDisk, which
//     assembles it late;
//   - StoppedCopyReadd: its copy could not resume at Open (its source was not assembled),
//     and one of its disks is failed and re-added (ReaddDisk assembles it late);
//   - FailedWhileServed: its copy fails while it is assembled and served (the engine's
//     OnFail, called as the engine calls it): later Array calls are refused.
//
// Each ends with the volume deleted and the pool's capacity back to its start.
func TestCopyTargetNeverServedUnlessWhole(t *testing.T) {
	t.Run("FailedCopyDisksReturn", func(t *testing.T) {
		p, returning := failedRestore(t)
		defer p.Close()
		for _, path := range returning {
			if _, err := p.AddDisk(DiskConfig{Path: path}); err != nil {
				t.Fatal(err)
			}
			checkNotServed(t, p, "r", "failed")
		}
		checkCopyFailedLabels(t, p, "r")
		deleteAll(t, p)
	})
	t.Run("StoppedCopyReadd", func(t *testing.T) {
		p, _, _, _ := stoppedCopy(t, true)
		defer p.Close()
		checkNotServed(t, p, "r", "stopped")
		d := diskPathsOf(t, p, "r")[0]
		if err := p.FailDisk(d); err != nil {
			t.Fatal(err)
		}
		if _, err := p.ReaddDisk(d); err != nil {
			t.Fatal(err)
		}
		checkNotServed(t, p, "r", "stopped")
		// The source "s" is not assembled: the target goes first, then the source.
		if err := p.DeleteVolume("r"); err != nil {
			t.Fatal(err)
		}
		deleteAll(t, p)
	})
	t.Run("FailedWhileServed", func(t *testing.T) {
		p, _, _ := runningRestore(t)
		defer p.Close()
		if _, err := p.Array("r"); err != nil {
			t.Fatalf("a restore whose copy runs is served (hydrated on read): %v", err)
		}
		p.mu.Lock()
		fail := p.onCopyFail(p.byName["r"])
		p.mu.Unlock()
		fail(errors.New("injected: the source's reads failed"))
		checkNotServed(t, p, "r", "failed")
		checkCopyFailedLabels(t, p, "r")
		deleteAll(t, p)
	})
}

// runningRestore builds a pool over six disks holding volume "v" (3 members), its ready
// snapshot "s" and a restore "r" of "s" (3 members) whose copy runs at 1 MiB/s. It returns
// the pool, its disks and its configuration.
func runningRestore(t *testing.T) (*Pool, []string, Config) {
	t.Helper()
	dir := t.TempDir()
	paths := makeDisks(t, dir, 6, 96<<20)
	cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}, RebuildRateMax: 64 << 20}
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 3}); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, p, "v", randBytes(16<<20), 0)
	if _, err := p.CreateSnapshot("s", "v"); err != nil {
		t.Fatal(err)
	}
	waitSnapshotReady(t, p, "s")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.RebuildRateMax = 1 << 20
	p = openPool(t, cfg)
	if _, err := p.CreateVolume("r", 16<<20, CreateOptions{Members: 3, Source: &Source{Snapshot: "s"}}); err != nil {
		t.Fatal(err)
	}
	return p, paths, cfg
}

// failedRestore is runningRestore reopened with two of r's three disks absent: r is not
// assembled while its copy ran, so its copy is marked failed. It returns the absent disks.
func failedRestore(t *testing.T) (*Pool, []string) {
	t.Helper()
	p, paths, cfg := runningRestore(t)
	absent := diskPathsOf(t, p, "r")[1:]
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, path := range paths {
		if !slices.Contains(absent, path) {
			keep = append(keep, path)
		}
	}
	p = openPool(t, Config{Disks: configFor(keep...).Disks, RebuildRateMax: cfg.RebuildRateMax})
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.byName["r"]; r == nil || r.arr != nil || r.flags&ExtentFlagCopyFailed == 0 {
		t.Fatal(`test set-up: want "r" unassembled with its copy failed`)
	}
	return p, absent
}

// checkNotServed checks that Array refuses volume name with ErrFailedPrecondition and a
// message naming it and containing why, and that its health is Failed with a reason.
func checkNotServed(t *testing.T, p *Pool, name, why string) {
	t.Helper()
	a, err := p.Array(name)
	if a != nil || !errors.Is(err, ErrFailedPrecondition) || !strings.Contains(err.Error(), `"`+name+`"`) || !strings.Contains(err.Error(), why) {
		t.Fatalf("Array(%q) = %v, %v: want ErrFailedPrecondition naming it, saying %q", name, a != nil, err, why)
	}
	vi := volumeInfo(t, p, name)
	if vi.Health != Failed || !strings.Contains(vi.Reason, why) || vi.Hydrated {
		t.Fatalf("volume %q: health %s, reason %q, hydrated %v: want Failed saying %q", name, vi.Health, vi.Reason, vi.Hydrated, why)
	}
	t.Logf("Array(%q) refused: %v", name, err)
}

// checkCopyFailedLabels checks that every present disk holding an extent of name records
// its copy as failed.
func checkCopyFailedLabels(t *testing.T, p *Pool, name string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.byName[name]
	for _, d := range p.holdersOf(v.uuid) {
		for _, x := range d.label.Extents {
			if x.Volume == v.uuid && x.Flags&ExtentFlagCopyFailed == 0 {
				t.Errorf("disk %s: extent of %q flags %#x: no failed copy recorded", d.path, name, x.Flags)
			}
		}
	}
}

// deleteAll deletes every volume and snapshot (targets before sources) and checks that
// the pool's disks hold no extent any more.
func deleteAll(t *testing.T, p *Pool) {
	t.Helper()
	for _, name := range []string{"r"} {
		if _, err := p.Volume(name); err == nil {
			if err := p.DeleteVolume(name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.DeleteSnapshot("s"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	for _, d := range p.Disks() {
		if d.Status == StatusActive && d.Extents != 0 {
			t.Fatalf("disk %s still holds %d extents", d.Path, d.Extents)
		}
	}
}
