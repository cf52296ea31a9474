package pool

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDeleteAroundStoppedCopy: a copy target whose copy could not resume at Open (its
// source did not assemble: two of its three disks are absent) holds no running copy. Deleting
// its source is refused with ErrFailedPrecondition naming the target, since the uncopied
// part of the target's data lives only on the source; deleting the target works, and then
// deleting the source works. Nothing panics. Both shapes: a snapshot of a volume (the
// source is a volume) and a restore from a snapshot (the source is a snapshot).
func TestDeleteAroundStoppedCopy(t *testing.T) {
	for _, restore := range []bool{false, true} {
		name := "SnapshotOfVolume"
		if restore {
			name = "RestoreFromSnapshot"
		}
		t.Run(name, func(t *testing.T) {
			p, src, target, _ := stoppedCopy(t, restore)
			defer p.Close()
			deleteSrc, deleteTarget := p.DeleteVolume, p.DeleteSnapshot
			if restore {
				deleteSrc, deleteTarget = p.DeleteSnapshot, p.DeleteVolume
			}
			err := deleteSrc(src)
			if !errors.Is(err, ErrFailedPrecondition) || !strings.Contains(err.Error(), `"`+target+`"`) {
				t.Fatalf("delete of %q, the source of a stopped copy: %v", src, err)
			}
			t.Logf("delete of the source refused: %v", err)
			if err := deleteTarget(target); err != nil {
				t.Fatalf("delete of the target %q: %v", target, err)
			}
			if err := deleteSrc(src); err != nil {
				t.Fatalf("delete of the source %q once the target is gone: %v", src, err)
			}
			// The restore's volume too, so that Check has nothing to scrub at the slow rate.
			if err := p.DeleteVolume("v"); err != nil {
				t.Fatal(err)
			}
			if c := p.Capacity(); c.FreeRaw != c.Raw {
				t.Fatalf("after every delete: %+v", c)
			}
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// stoppedCopy builds a pool over six disks in which a copy into target from src is
// unfinished and src is not assembled (two of its three disks are left out at the last
// Open), so the copy could not resume. Without restore, src is a volume and target its
// snapshot; with restore, src is a snapshot (ready) and target a volume restored from it.
// absent are src's two disks left out.
func stoppedCopy(t *testing.T, restore bool) (p *Pool, src, target string, absent []string) {
	t.Helper()
	dir := t.TempDir()
	paths := makeDisks(t, dir, 6, 96<<20)
	all := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}, RebuildRateMax: 64 << 20}
	slow := all
	slow.RebuildRateMax = 1 << 20
	p = openPool(t, all)
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 3}); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, p, "v", randBytes(16<<20), 0)
	src, target = "v", "s"
	if restore {
		if _, err := p.CreateSnapshot("s", "v"); err != nil {
			t.Fatal(err)
		}
		waitSnapshotReady(t, p, "s")
		src, target = "s", "r"
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, slow)
	var err error
	if restore {
		_, err = p.CreateVolume("r", 16<<20, CreateOptions{Members: 3, Source: &Source{Snapshot: "s"}})
	} else {
		_, err = p.CreateSnapshot("s", "v")
	}
	if err != nil {
		t.Fatal(err)
	}
	srcDisks, targetDisks := diskPathsOf(t, p, src), diskPathsOf(t, p, target)
	for _, d := range srcDisks {
		if slices.Contains(targetDisks, d) {
			t.Fatalf("test set-up: %q shares disk %s with %q", target, d, src)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, path := range paths {
		if !slices.Contains(srcDisks[:2], path) {
			keep = append(keep, path)
		}
	}
	p = openPool(t, Config{Disks: configFor(keep...).Disks, RebuildRateMax: slow.RebuildRateMax})
	p.mu.Lock()
	defer p.mu.Unlock()
	s, tg := p.byName["v"], p.snaps["s"]
	if restore {
		s, tg = p.snaps["s"], p.byName["r"]
	}
	if s == nil || s.arr != nil || tg == nil || !tg.copying() || tg.copy != nil {
		t.Fatalf("test set-up: want %q unassembled and %q copying without a copier", src, target)
	}
	return p, src, target, srcDisks[:2]
}

// diskPathsOf lists the disks of a volume's or snapshot's roles, in role order.
func diskPathsOf(t *testing.T, p *Pool, name string) []string {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.byName[name]
	if v == nil {
		v = p.snaps[name]
	}
	if v == nil {
		t.Fatalf("no volume or snapshot %q", name)
	}
	var out []string
	for _, r := range v.roles {
		out = append(out, r.disk.path)
	}
	return out
}
