package pool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestNamesAndSizes(t *testing.T) {
	dir := t.TempDir()
	p := openPool(t, configFor(makeDisks(t, dir, 4, testDiskSize)...))
	defer p.Close()
	if _, err := p.CreateVolume("taken", 8<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		vol     string
		size    uint64
		members int
		want    error
	}{
		{"empty name", "", 1 << 20, 0, ErrInvalidArgument},
		{"name of 64 bytes", strings.Repeat("a", 64), 1 << 20, 0, ErrInvalidArgument},
		{"name of 63 bytes", strings.Repeat("b", 63), 1 << 20, 0, nil},
		{"slash in name", "a/b", 1 << 20, 0, ErrInvalidArgument},
		{"leading dot", ".hidden", 1 << 20, 0, ErrInvalidArgument},
		{"NUL in name", "a\x00b", 1 << 20, 0, ErrInvalidArgument},
		{"size 0", "zero", 0, 0, ErrInvalidArgument},
		{"size above the maximum", "huge", MaxVolumeSize + 1, 0, ErrInvalidArgument},
		{"size above the free space", "big", 4 << 30, 0, ErrNoSpace},
		{"one member", "one", 1 << 20, 1, ErrInvalidArgument},
		{"more members than disks", "five", 1 << 20, 5, ErrNoSpace},
		{"same name, other size", "taken", 16 << 20, 0, ErrAlreadyExists},
		{"same name, same size", "taken", 8 << 20, 0, nil},
		{"same name, same size after rounding", "taken", 8<<20 - 1, 0, nil},
		{"odd member count", "odd", 3 << 20, 3, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vi, err := p.CreateVolume(c.vol, c.size, CreateOptions{Members: c.members})
			if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if err == nil && (vi.Health != Healthy || vi.Size < c.size) {
				t.Fatalf("volume %+v", vi)
			}
		})
	}
	if vs := p.Volumes(); len(vs) != 3 {
		t.Fatalf("volumes: %+v", vs)
	}
	if _, err := p.ExpandVolume("nope", 1<<30); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expand of a missing volume: %v", err)
	}
	if _, err := p.ExpandVolume("taken", 4<<20); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("shrink: %v", err)
	}
	if _, err := p.Volume("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("status of a missing volume: %v", err)
	}
}

// TestCapacity checks the arithmetic on known numbers: 4 disks of 256 MiB with 1 MiB
// alignment have 255 MiB of data area each (the label takes the first MiB); a volume over N
// members with extents of E bytes holds N*(E - 1 MiB engine metadata)/2.
func TestCapacity(t *testing.T) {
	const mi = 1 << 20
	dir := t.TempDir()
	paths := makeDisks(t, dir, 5, testDiskSize)
	cfg := configFor(paths[:4]...)
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: paths[4], Spare: true})
	p := openPool(t, cfg)
	defer p.Close()
	want := Capacity{Raw: 4 * 255 * mi, Usable: 2 * 255 * mi, FreeRaw: 4 * 255 * mi, FreeUsable: 2 * 255 * mi,
		LargestVolume: 2 * 254 * mi, Spare: 255 * mi}
	if got := p.Capacity(); got != want {
		t.Fatalf("empty pool:\n got %+v\nwant %+v", got, want)
	}
	// 64 MiB over 4: 32 MiB of data per member + 1 MiB metadata = 33 MiB extents.
	vi, err := p.CreateVolume("a", 64*mi, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if vi.Members[0].Length != 33*mi {
		t.Fatalf("extent length %d", vi.Members[0].Length)
	}
	want.FreeRaw, want.FreeUsable = 4*222*mi, 2*222*mi
	want.LargestVolume = 2 * 221 * mi
	if got := p.Capacity(); got != want {
		t.Fatalf("after 64 MiB:\n got %+v\nwant %+v", got, want)
	}
	// Over 2 members (the two with most room): 10 MiB data each + 1 MiB.
	if _, err := p.CreateVolume("b", 10*mi, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	// The largest volume is bounded by the fullest disk: 222-11 = 211 MiB free there.
	if got := p.Capacity().LargestVolume; got != 2*210*mi {
		t.Fatalf("largest after b: %d MiB", got/mi)
	}
	largest := p.Capacity().LargestVolume
	if _, err := p.CreateVolume("too-big", largest+mi, CreateOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("largest+1MiB: %v", err)
	}
	if _, err := p.CreateVolume("largest", largest, CreateOptions{}); err != nil {
		t.Fatalf("largest: %v", err)
	}
	if c := p.Capacity(); c.LargestVolume != 0 && c.LargestVolume > 2*11*mi {
		t.Fatalf("after filling: %+v", c)
	}
	// Delete gives the space back.
	for _, n := range []string{"largest", "b", "a"} {
		if err := p.DeleteVolume(n); err != nil {
			t.Fatal(err)
		}
	}
	want.FreeRaw, want.FreeUsable, want.LargestVolume = 4*255*mi, 2*255*mi, 2*254*mi
	if got := p.Capacity(); got != want {
		t.Fatalf("after deletes:\n got %+v\nwant %+v", got, want)
	}
	if err := p.DeleteVolume("a"); err != nil {
		t.Fatalf("delete of a missing volume: %v", err)
	}
}

func TestAllocationPolicies(t *testing.T) {
	const mi = 1 << 20
	l := &Label{DataStart: mi, DataEnd: 100 * mi, Alignment: mi, Extents: []ExtentEntry{
		{Offset: 10 * mi, Length: 10 * mi}, // free: [1,10) 9 MiB, [20,30) 10, [40,100) 60
		{Offset: 30 * mi, Length: 10 * mi},
	}}
	if off, ok := allocate(l, 9*mi, FirstFit); !ok || off != mi {
		t.Fatalf("first fit 9 MiB: %d %v", off, ok)
	}
	if off, ok := allocate(l, 10*mi, FirstFit); !ok || off != 20*mi {
		t.Fatalf("first fit 10 MiB: %d %v", off, ok)
	}
	if off, ok := allocate(l, 5*mi, BestFit); !ok || off != mi {
		t.Fatalf("best fit 5 MiB: %d %v", off, ok)
	}
	if off, ok := allocate(l, 9*mi+1, BestFit); !ok || off != 20*mi {
		t.Fatalf("best fit 9 MiB+1 (aligned to 10): %d %v", off, ok)
	}
	if _, ok := allocate(l, 61*mi, FirstFit); ok {
		t.Fatal("61 MiB fits in 60")
	}
	if g := growable(l, 10*mi); g != 10*mi {
		t.Fatalf("growable after the first extent: %d", g)
	}
	if g := growable(l, 30*mi); g != 60*mi {
		t.Fatalf("growable after the second extent: %d", g)
	}
}

// TestDeleteReleasesAndDiscards: delete removes the extents from every label and punches
// them out of file disks; an interrupted delete is finished by the next Open.
func TestDeleteReleasesAndDiscards(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(paths...)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("d", 64<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, p, "d", randBytes(32<<20), 0)
	blocks := func() int64 {
		var st syscall.Stat_t
		if err := syscall.Stat(paths[0], &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	used := blocks()
	if err := p.DeleteVolume("d"); err != nil {
		t.Fatal(err)
	}
	if after := blocks(); after > used-8<<20 {
		t.Fatalf("disk 0 allocated %d bytes before delete, %d after: not discarded", used, after)
	}
	for _, d := range p.Disks() {
		if d.Extents != 0 {
			t.Fatalf("extents left: %+v", d)
		}
	}

	// Interrupted delete: the extents are marked deleting on one disk only, then the
	// process stops. Open finishes the delete instead of assembling a partial volume.
	if _, err := p.CreateVolume("e", 32<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	d0 := p.disks[0]
	if err := p.writeLabel(d0, func(l *Label) { l.Extents[0].Flags |= ExtentFlagDeleting }); err != nil {
		t.Fatal(err)
	}
	p.mu.Unlock()
	p.Close()
	p = openPool(t, cfg)
	if vs := p.Volumes(); len(vs) != 0 {
		t.Fatalf("volumes after an interrupted delete: %+v", vs)
	}
	for _, d := range p.Disks() {
		if d.Extents != 0 {
			t.Fatalf("extents left: %+v", d)
		}
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}

	// Interrupted create: one disk's extent still flagged creating. Rolled back.
	if _, err := p.CreateVolume("f", 32<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	if err := p.writeLabel(p.disks[2], func(l *Label) { l.Extents[0].Flags |= ExtentFlagCreating }); err != nil {
		t.Fatal(err)
	}
	p.mu.Unlock()
	p.Close()
	p = openPool(t, cfg)
	defer p.Close()
	if vs := p.Volumes(); len(vs) != 0 {
		t.Fatalf("volumes after an interrupted create: %+v", vs)
	}
	if c := p.Capacity(); c.FreeRaw != c.Raw {
		t.Fatalf("space not released: %+v", c)
	}
}

func TestExpand(t *testing.T) {
	dir := t.TempDir()
	p := openPool(t, configFor(makeDisks(t, dir, 2, 128<<20)...))
	defer p.Close()
	if _, err := p.CreateVolume("a", 16<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVolume("b", 16<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// a is followed directly by b (first fit): no room in place.
	_, err := p.ExpandVolume("a", 32<<20)
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "cannot grow in place") {
		t.Fatalf("expand without room: %v", err)
	}
	// b has room after it: the extents and the array grow in place, data kept.
	data := bytes.Repeat([]byte{0x5a}, 4096)
	writeVolume(t, p, "b", data, 16<<20-4096)
	vi, err := p.ExpandVolume("b", 32<<20)
	if err != nil {
		t.Fatalf("expand with room: %v", err)
	}
	if vi.Size != 32<<20 || vi.Health != Healthy {
		t.Fatalf("expand with room: %+v", vi)
	}
	if a, _ := p.Array("b"); a.Size() != 32<<20 {
		t.Fatalf("array size after expand: %d", a.Size())
	}
	checkVolume(t, p, "b", data, 16<<20-4096)
	checkVolume(t, p, "b", make([]byte, 4096), 16<<20)
	writeVolume(t, p, "b", data, 32<<20-4096)
	checkVolume(t, p, "b", data, 32<<20-4096)
	if vi, _ := p.Volume("b"); vi.Size != 32<<20 || vi.Health != Healthy {
		t.Fatalf("after expand: %+v", vi)
	}
}

// TestMonitorFailsDiskOnIOError: when the engine fails a member on its own (an I/O
// error), the pool marks the disk failed for every volume on it and a spare takes over.
func TestMonitorFailsDiskOnIOError(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(paths[:3]...)
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: paths[3], Spare: true})
	p := openPool(t, cfg)
	defer p.Close()
	for _, n := range []string{"x", "y"} {
		if _, err := p.CreateVolume(n, 16<<20, CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "y", data, 0)
	a, _ := p.Array("x")
	if err := a.FailMember(1); err != nil { // as the engine does on an I/O error
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, func() (bool, string) { // Failed, then Removed once the spare took over
		return diskByPath(t, p, paths[1]).Status != StatusActive, fmt.Sprintf("disk not marked failed: %+v", p.Disks())
	})
	// y had a member on the same disk: it was failed too, and both rebuild on the spare.
	waitHealth(t, p, "x", Healthy)
	waitHealth(t, p, "y", Healthy)
	if d := diskByPath(t, p, paths[3]); d.Status != StatusActive || d.Extents != 2 {
		t.Fatalf("spare: %+v", d)
	}
	checkVolume(t, p, "y", data, 0)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestTwoPoolsMixed: disks of two pools offered together are refused as a whole unless
// the configuration names the pool; then the other pool's disks are refused untouched.
func TestTwoPoolsMixed(t *testing.T) {
	dir := t.TempDir()
	a := makeDisks(t, dir+"/", 2, 64<<20)
	bdir := t.TempDir()
	b := makeDisks(t, bdir+"/", 2, 64<<20)
	pa := openPool(t, configFor(a...))
	if _, err := pa.CreateVolume("va", 8<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	uuidA := pa.UUID()
	pa.Close()
	pb := openPool(t, configFor(b...))
	if _, err := pb.CreateVolume("vb", 8<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pb.Close()
	hashB := hashFile(t, b[0])

	mixed := configFor(a[0], b[0], a[1], b[1])
	if _, err := Open(mixed); !errors.Is(err, ErrMixedPools) {
		t.Fatalf("mixed pools: %v", err)
	}
	mixed.PoolUUID = uuidA.String()
	p := openPool(t, mixed)
	defer p.Close()
	for _, path := range b {
		if d := diskByPath(t, p, path); d.Status != StatusRefused || !strings.Contains(d.Reason, "another pool") {
			t.Fatalf("pool B disk: %+v", d)
		}
	}
	if _, err := p.AddDisk(DiskConfig{Path: b[0]}); !errors.Is(err, ErrOtherPool) {
		t.Fatalf("AddDisk of pool B's disk: %v", err)
	}
	if vs := p.Volumes(); len(vs) != 1 || vs[0].Name != "va" || vs[0].Health != Healthy {
		t.Fatalf("volumes: %+v", vs)
	}
	if hashFile(t, b[0]) != hashB {
		t.Fatal("pool B's disk was modified")
	}
	// A cloned disk (same disk UUID twice) is refused, never guessed.
	clone := dir + "/clone.img"
	raw, _ := os.ReadFile(a[1])
	if err := os.WriteFile(clone, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p2 := openPool(t, configFor(a[0], a[1], clone))
	defer p2.Close()
	if d := diskByPath(t, p2, clone); d.Status != StatusRefused || !strings.Contains(d.Reason, "same disk UUID") {
		t.Fatalf("clone: %+v", d)
	}
}
