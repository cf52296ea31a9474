package pool

import (
	"errors"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestOpenDiskMembers: with Config.OpenDisk the pool claims disks that are no files (here
// raid10.MemMember, as the hollow nodes of test/scale do with theirs): it labels them,
// allocates extents on them, serves a volume written and read through its array, and a
// second Open over the same members finds the volume again from their labels. A path the
// opener refuses is a Refused disk naming the opener's error.
func TestOpenDiskMembers(t *testing.T) {
	const diskSize = 64 << 20
	mems := map[string]*raid10.MemMember{}
	for _, p := range []string{"mem/d0", "mem/d1", "mem/d2", "mem/d3"} {
		mems[p] = raid10.NewMemMember(diskSize)
	}
	errGone := errors.New("no such memory disk")
	cfg := Config{
		Disks: []DiskConfig{{Path: "mem/d0"}, {Path: "mem/d1"}, {Path: "mem/d2"}, {Path: "mem/d3"}, {Path: "mem/gone"}},
		OpenDisk: func(path string) (raid10.Member, error) {
			if m, ok := mems[path]; ok {
				return m, nil
			}
			return nil, errGone
		},
	}
	p, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open over memory disks: %v", err)
	}
	st := p.Status()
	active, refused := 0, 0
	for _, d := range st.Disks {
		switch d.Status {
		case StatusActive:
			active++
		case StatusRefused:
			refused++
			if d.Path != "mem/gone" || !strings.Contains(d.Reason, errGone.Error()) {
				t.Errorf("refused disk %+v, want mem/gone", d)
			}
		}
	}
	if active != 4 || refused != 1 {
		t.Fatalf("disks %+v: want 4 active and mem/gone refused", st.Disks)
	}
	v, err := p.CreateVolume("v1", 16<<20, CreateOptions{Members: 4})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	arr, err := p.Array("v1")
	if err != nil {
		t.Fatalf("Array: %v", err)
	}
	want := make([]byte, raid10.BlockSize)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if _, err := arr.WriteAt(want, 4<<20); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	p, err = Open(cfg)
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	defer func() { _ = p.Close() }()
	got, err := p.Volume("v1")
	if err != nil || got.UUID != v.UUID || got.Health != Healthy {
		t.Fatalf("volume after reopen: %+v, %v; want %s Healthy", got, err, v.UUID)
	}
	buf := make([]byte, raid10.BlockSize)
	if arr, err = p.Array("v1"); err != nil {
		t.Fatalf("Array after reopen: %v", err)
	}
	if _, err := arr.ReadAt(buf, 4<<20); err != nil || string(buf) != string(want) {
		t.Fatalf("data after reopen differs (err %v)", err)
	}
	if err := p.DeleteVolume("v1"); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
}
