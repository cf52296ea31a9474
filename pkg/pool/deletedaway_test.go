package pool

import (
	"bytes"
	"testing"
)

// TestDeleteWhileDiskAway: a volume deleted while one of its disks is left out of the pool
// stays deleted when that disk comes back at the next Open: its extent there is released
// (the capacity is back at its start) and a new volume of the same name, created meanwhile,
// is the one served, with its data. Before the fix the old volume came back from the
// returning disk's label (Degraded, half its members) and shadowed the new one.
func TestDeleteWhileDiskAway(t *testing.T) {
	paths := makeDisks(t, t.TempDir(), 3, 96<<20)
	all := configFor(paths...)
	p := openPool(t, all)
	start := p.Capacity()
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	away := diskPathsOf(t, p, "v")[0]
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for _, path := range paths {
		if path != away {
			rest = append(rest, path)
		}
	}
	p = openPool(t, configFor(rest...))
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVolume("v", 8<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "v", data, 0)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p = openPool(t, all)
	defer p.Close()
	if vs := p.Volumes(); len(vs) != 1 || vs[0].Size != 8<<20 || vs[0].Health != Healthy {
		t.Fatalf("after the disk came back: %+v; want only the new, healthy 8 MiB v", vs)
	}
	a, err := p.Array("v")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readArray(t, a, 1<<20), data) {
		t.Fatal("v does not hold the new volume's data")
	}
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	checkFreed(t, p, start)
}

// TestDeleteWhileDiskAwayReturnedByAddDisk: a volume deleted while one of its disks is
// left out, whose disk then returns through AddDisk, stays deleted at a later Open that
// goes without its other disk: AddDisk releases the returning disk's extent. Before the
// fix that extent stayed, and the Open without the other disk assembled the deleted
// volume from it (Degraded, with the deleted data).
func TestDeleteWhileDiskAwayReturnedByAddDisk(t *testing.T) {
	paths := makeDisks(t, t.TempDir(), 3, 96<<20)
	p := openPool(t, configFor(paths...))
	start := p.Capacity()
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	members := diskPathsOf(t, p, "v")
	away, other := members[0], members[1]
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	without := func(x string) []string {
		var rest []string
		for _, path := range paths {
			if path != x {
				rest = append(rest, path)
			}
		}
		return rest
	}
	p = openPool(t, configFor(without(away)...))
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AddDisk(DiskConfig{Path: away}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p = openPool(t, configFor(without(other)...))
	if vs := p.Volumes(); len(vs) != 0 {
		t.Fatalf("after an Open without %s: %+v; want no volume (v was deleted)", other, vs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, configFor(paths...))
	defer p.Close()
	checkFreed(t, p, start)
}
