package pool

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestLateAssemblyTrustsNoStaleMember: a mirror's member that was away while the volume
// took writes is never served as in sync because its partner's disk failed since. A
// two-member volume on disks 0 and 1 of three (disk 2 carries the pool's table). Disk 1 is
// away at a start and the volume is written on disk 0 alone; disk 0 is failed (by the
// operator: its data is still readable); at the next start disk 1 is away again, so the
// volume is known but not assembled; then disk 1 returns (AddDisk) and the volume is
// assembled late. Disk 1 alone holds the old data: it must not be served (Failed, EIO), and
// when disk 0 is re-added the volume reads the writes disk 1 missed. Before the engine read
// the failed disk's superblock as a witness (AssembleOptions.Witnesses), the late assembly
// served disk 1's old data (the pool matrix's seed 1796199122708649481 hit it through a
// snapshot's copy).
func TestLateAssemblyTrustsNoStaleMember(t *testing.T) {
	p, paths, _, cur := staleMemberPool(t)
	defer func() { p.Close() }()

	// Disk 0 back in service: its copy is the current one, disk 1 recovers from it.
	if _, err := p.ReaddDisk(paths[0]); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	checkVolume(t, p, "v", cur, 0)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestStaleMemberWhenCurrentCopyLeaves: as TestLateAssemblyTrustsNoStaleMember, but disk
// 0, the only one with v's current data, leaves. ReplaceDisk refuses it, naming v; a hot
// spare's takeover leaves v's role on it (v is not assembled); then the disk leaves the
// machine. v is Failed at the next start, never served from disk 1's old data: the engine
// recorded disk 1's member stale in its own superblock when disk 0's witnessed it.
func TestStaleMemberWhenCurrentCopyLeaves(t *testing.T) {
	p, paths, old, _ := staleMemberPool(t)
	dir := t.TempDir()
	disks := makeDisks(t, dir, 2, testDiskSize)
	_, err := p.ReplaceDisk(paths[0], DiskConfig{Path: disks[0]})
	if !errors.Is(err, ErrFailedPrecondition) || !strings.Contains(err.Error(), `volume "v"`) {
		t.Fatalf("ReplaceDisk of the disk with v's only current copy: %v, want FailedPrecondition naming v", err)
	}
	if _, err := p.AddDisk(DiskConfig{Path: disks[1], Spare: true}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := os.Remove(paths[0]); err != nil {
		t.Fatal(err)
	}
	var cfg Config
	for _, d := range p.cfg.Disks {
		if d.Path != paths[0] {
			cfg.Disks = append(cfg.Disks, d)
		}
	}
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: disks[1]})
	p = openPool(t, cfg)
	defer p.Close()
	failedNotOld(t, p, old, "after its only current copy left")
}

// staleMemberPool leaves a pool (running) where v, a two-member volume, is known but not
// served: its member on paths[1] missed the writes (cur over old) that its member on
// paths[0] took, and paths[0] is failed. It checks that the late assembly at paths[1]'s
// return refuses v.
func staleMemberPool(t *testing.T) (p *Pool, paths []string, old, cur []byte) {
	t.Helper()
	dir := t.TempDir()
	all := makeDisks(t, dir, 3, testDiskSize)
	cfg := configFor(all...)
	away := func(path string) func() {
		t.Helper()
		if err := os.Rename(path, path+".away"); err != nil {
			t.Fatal(err)
		}
		return func() {
			t.Helper()
			if err := os.Rename(path+".away", path); err != nil {
				t.Fatal(err)
			}
		}
	}

	p = openPool(t, cfg)
	if _, err := p.CreateVolume("v", 64<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	paths = volumeDiskPaths(p, "v") // by role
	old = randBytes(1 << 20)
	writeVolume(t, p, "v", old, 0)
	p.Close()

	back := away(paths[1])
	p = openPool(t, cfg)
	waitHealth(t, p, "v", Degraded)
	cur = randBytes(1 << 20)
	writeVolume(t, p, "v", cur, 0)
	if err := p.FailDisk(paths[0]); err != nil {
		t.Fatal(err)
	}
	p.Close()

	p = openPool(t, cfg)
	if _, err := p.Array("v"); err == nil {
		t.Fatal("v is served from its failed disk")
	}
	back()
	if _, err := p.AddDisk(DiskConfig{Path: paths[1]}); err != nil {
		t.Fatal(err)
	}
	if a, err := p.Array("v"); err == nil {
		got := make([]byte, len(cur))
		_, rerr := a.ReadAt(got, 0)
		switch {
		case rerr != nil:
		case bytes.Equal(got, old):
			t.Fatal("v is served from the member that was away: it reads the data the later writes replaced")
		case !bytes.Equal(got, cur):
			t.Fatal("v reads neither its old nor its current data")
		}
	}
	if vi := volumeInfo(t, p, "v"); vi.Health != Failed {
		t.Fatalf("v with only its stale member: %s, want Failed", vi.Health)
	}

	return p, paths, old, cur
}

// TestMirrorFlipNeverServesStale: a two-member volume starts without disk A and takes
// writes on disk B alone; the next start has A back but B away. Nothing present then knows
// that A missed writes but the disk table, which recorded A away (DiskFlagAway): v must not
// be served from A's old data. When B returns v is served with its current data, A is
// rebuilt, and the flag is cleared (a later start with B away again serves v from A).
// Before the flag, the second start served A's old data.
func TestMirrorFlipNeverServesStale(t *testing.T) {
	dir := t.TempDir()
	all := makeDisks(t, dir, 3, testDiskSize)
	cfg := configFor(all...)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 64<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	paths := volumeDiskPaths(p, "v")
	old := randBytes(1 << 20)
	writeVolume(t, p, "v", old, 0)
	p.Close()
	away := func(path string) {
		t.Helper()
		if err := os.Rename(path, path+".away"); err != nil {
			t.Fatal(err)
		}
	}
	back := func(path string) {
		t.Helper()
		if err := os.Rename(path+".away", path); err != nil {
			t.Fatal(err)
		}
	}

	away(paths[0])
	p = openPool(t, cfg)
	cur := randBytes(1 << 20)
	writeVolume(t, p, "v", cur, 0)
	p.Close()

	back(paths[0])
	away(paths[1])
	p = openPool(t, cfg)
	failedNotOld(t, p, old, "with only the member that missed its writes")
	back(paths[1])
	if _, err := p.AddDisk(DiskConfig{Path: paths[1]}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	checkVolume(t, p, "v", cur, 0)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	for _, d := range p.disks {
		if d.away {
			t.Errorf("disk %s still flagged away after every volume on it was assembled", d.path)
		}
	}
	p.mu.Unlock()
	p.Close()

	// Rebuilt and no longer doubtful: a start without B serves v from A.
	away(paths[1])
	p = openPool(t, cfg)
	defer p.Close()
	waitHealth(t, p, "v", Degraded)
	checkVolume(t, p, "v", cur, 0)
}

// volumeDiskPaths is the paths of name's member disks, by role.
func volumeDiskPaths(p *Pool, name string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var paths []string
	for _, u := range p.byName[name].disks {
		for _, d := range p.disks {
			if d.uuid == u {
				paths = append(paths, d.path)
			}
		}
	}
	return paths
}

// failedNotOld: v, whose only current copy is out of reach, is Failed (when) and, if it is
// served at all, never reads old, the data later writes replaced.
func failedNotOld(t *testing.T, p *Pool, old []byte, when string) {
	t.Helper()
	if a, err := p.Array("v"); err == nil {
		got := make([]byte, len(old))
		if _, err := a.ReadAt(got, 0); err == nil && bytes.Equal(got, old) {
			t.Fatalf("v %s is served from a member that missed writes: it reads the data they replaced", when)
		}
	}
	if vi := volumeInfo(t, p, "v"); vi.Health != Failed {
		t.Fatalf("v %s: %s, want Failed", when, vi.Health)
	}
}
