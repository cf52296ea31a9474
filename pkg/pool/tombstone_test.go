package pool

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"slices"
	"testing"
)

// TestDeletedStaysDeletedOtherDiskFailed: a volume or snapshot deleted while one of its
// disks was left out stays deleted when that disk comes back at an Open where its other
// disk is present but failed: the tombstone its delete wrote (on every disk present then)
// makes Open release the returning disk's extent, and a readd of the failed disk brings
// nothing back either; the capacity is back at its start. Without the tombstone no present
// Active disk had forgotten the object (the deletedAway rule) and it came back from the
// returning disk, Degraded, with the deleted data.
func TestDeletedStaysDeletedOtherDiskFailed(t *testing.T) {
	for _, snap := range []bool{false, true} {
		name := map[bool]string{false: "volume", true: "snapshot"}[snap]
		t.Run(name, func(t *testing.T) {
			paths := makeDisks(t, t.TempDir(), 4, 96<<20)
			p := openPool(t, configFor(paths...))
			start := p.Capacity()
			if _, err := p.CreateVolume("v", 8<<20, CreateOptions{Members: 2}); err != nil {
				t.Fatal(err)
			}
			obj := "v"
			if snap {
				obj = "s"
				if _, err := p.CreateSnapshot("s", "v"); err != nil {
					t.Fatal(err)
				}
			}
			members := diskPathsOf(t, p, obj)
			away, other := members[0], members[1]
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			rest := slices.DeleteFunc(slices.Clone(paths), func(s string) bool { return s == away })
			p = openPool(t, configFor(rest...))
			var err error
			if snap {
				err = p.DeleteSnapshot("s")
			} else {
				err = p.DeleteVolume("v")
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := p.FailDisk(other); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}

			p = openPool(t, configFor(paths...))
			defer func() { _ = p.Close() }()
			if _, err := p.Snapshot("s"); snap && err == nil {
				t.Fatalf("deleted snapshot s is back after its disk %s returned (other disk %s failed)", away, other)
			}
			if _, err := p.Volume("v"); !snap && err == nil {
				t.Fatalf("deleted volume v is back after its disk %s returned (other disk %s failed)", away, other)
			}
			if _, err := p.ReaddDisk(other); err != nil {
				t.Fatal(err)
			}
			if snap {
				if err := p.DeleteVolume("v"); err != nil {
					t.Fatal(err)
				}
			}
			if vs, ss := p.Volumes(), p.Snapshots(); len(vs)+len(ss) != 0 {
				t.Fatalf("with everything deleted the pool lists %+v and %+v", vs, ss)
			}
			checkFreed(t, p, start)
		})
	}
}

// TestDeletedStaysDeletedBystanderKnows: a volume deleted while one of its disks was away is
// not brought back by an Open that finds that disk and only a disk that was not its member
// (the one that knows of the delete through its tombstone): the tombstone was written to
// every disk present at the delete, not only to the volume's.
func TestDeletedStaysDeletedBystanderKnows(t *testing.T) {
	paths := makeDisks(t, t.TempDir(), 3, 96<<20)
	p := openPool(t, configFor(paths...))
	if _, err := p.CreateVolume("v", 8<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	members := diskPathsOf(t, p, "v")
	away, other := members[0], members[1]
	bystander := slices.DeleteFunc(slices.Clone(paths), func(s string) bool { return s == away || s == other })[0]
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, configFor(other, bystander))
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, configFor(away, bystander))
	defer func() { _ = p.Close() }()
	if vs := p.Volumes(); len(vs) != 0 {
		t.Fatalf("Open with %s (v's, away at the delete) and %s: %+v; want no volume", away, bystander, vs)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestTombstonesBounded: tombstones are dropped once every disk of the table is present
// and holds no extent of the deleted object, and never exceed MaxTombstones.
func TestTombstonesBounded(t *testing.T) {
	paths := makeDisks(t, t.TempDir(), 3, 96<<20)
	p := openPool(t, configFor(paths...))
	if _, err := p.CreateVolume("v", 8<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, configFor(paths...))
	defer func() { _ = p.Close() }()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tombs) != 0 {
		t.Fatalf("every disk present and released, yet %d tombstones kept", len(p.tombs))
	}
	for _, d := range p.disks {
		if n := len(d.label.Tombstones); n != 0 {
			t.Errorf("disk %s: %d tombstones on disk after the prune", d.path, n)
		}
	}
	var many []Tombstone
	for i := range MaxTombstones + 10 {
		many = append(many, Tombstone{Volume: NewUUID(), Seq: uint64(i + 1)})
	}
	got := mergeTombstones(nil, many)
	if len(got) != MaxTombstones || got[0].Seq != 11 || got[len(got)-1].Seq != MaxTombstones+10 {
		t.Fatalf("merge kept %d tombstones, seq %d..%d; want the newest %d", len(got), got[0].Seq, got[len(got)-1].Seq, MaxTombstones)
	}
}

// TestLabelTombstones: the tombstone table round-trips at the documented offsets
// (docs/on-disk-format.md: count at header byte 168, entry size 32 at 170, the entries
// after the member maps: UUID, seq, delete time), and a version 1 label (bytes 168..171
// zero, no table) is still read.
func TestLabelTombstones(t *testing.T) {
	l := sampleLabel()
	l.Tombstones = []Tombstone{{Volume: NewUUID(), Seq: 4, Deleted: 1764600000000000000}, {Volume: NewUUID(), Seq: 9, Deleted: 1}}
	b, err := l.Encode()
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	n := int(le.Uint32(b[12:]))
	at := n - 2*tombstoneSize
	if le.Uint16(b[8:]) != 2 || le.Uint16(b[168:]) != 2 || le.Uint16(b[170:]) != 32 ||
		UUID(b[at:at+16]) != l.Tombstones[0].Volume || le.Uint64(b[at+16:]) != 4 || le.Uint64(b[at+24:]) != 1764600000000000000 {
		t.Fatalf("tombstone table not where the format says: header % x, first entry % x", b[160:176], b[at:at+32])
	}
	got, err := DecodeLabel(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, l) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, l)
	}

	v1, _ := sampleLabel().Encode()
	m := int(le.Uint32(v1[12:]))
	le.PutUint16(v1[8:], 1)
	le.PutUint16(v1[170:], 0)
	le.PutUint32(v1[m:], crc32.Checksum(v1[:m], castagnoli))
	if got, err := DecodeLabel(v1); err != nil || len(got.Tombstones) != 0 {
		t.Fatalf("version 1 label: %v, %+v", err, got)
	}
	le.PutUint16(v1[168:], 1)
	le.PutUint32(v1[m:], crc32.Checksum(v1[:m], castagnoli))
	if _, err := DecodeLabel(v1); !errors.Is(err, ErrCorruptLabel) {
		t.Fatalf("version 1 label with a tombstone count: %v, want ErrCorruptLabel", err)
	}
}
