package pool

import (
	"fmt"
	"testing"
	"time"
)

// TestSpareAtStartWhileCopiesFinish: a pool opens with a disk recorded as failed, a spare,
// and snapshot copies that resume and finish at once. The copies' ready callbacks write
// labels (under p.mu) while Open's spare takeover writes labels on the same disks; without
// p.mu held there the race detector reports it (two writers of one disk's label pick the
// same slot, and one update is lost). Run with -race. Ends with Check.
func TestSpareAtStartWhileCopiesFinish(t *testing.T) {
	paths := makeDisks(t, t.TempDir(), 6, 128<<20)
	cfg := configFor(paths[:5]...)
	cfg.RebuildRateMax = 256 << 10 // copies crawl: they are unfinished at the Close
	p := openPool(t, cfg)
	for i := range 4 {
		v := fmt.Sprintf("v%d", i)
		if _, err := p.CreateVolume(v, 16<<20, CreateOptions{Members: 4}); err != nil {
			t.Fatal(err)
		}
		writeVolume(t, p, v, randBytes(1<<20), 0)
	}
	if err := p.FailDisk(paths[2]); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := p.CreateSnapshot(fmt.Sprintf("sv%d", i), fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.RebuildRateMax = 1 << 30
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: paths[5], Spare: true})
	p = openPool(t, cfg)
	defer func() { _ = p.Close() }()
	for i := range 4 {
		waitHealth(t, p, fmt.Sprintf("v%d", i), Healthy)
	}
	waitUntil(t, time.Minute, func() (bool, string) {
		for _, si := range p.Snapshots() {
			if !si.Ready {
				return false, si.Name + " not ready"
			}
		}
		return true, ""
	})
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}
