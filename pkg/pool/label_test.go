package pool

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func sampleLabel() *Label {
	l := &Label{
		Generation: 7, PoolEpoch: 3, Pool: NewUUID(), Disk: NewUUID(), PoolName: "node-a",
		DiskSize: 1 << 30, DataStart: LabelAreaSize, DataEnd: 1 << 30, Alignment: 1 << 20,
		Disks: []DiskEntry{{UUID: NewUUID(), State: DiskActive, Size: 1 << 30, Identity: "wwn-0x5000c500a1b2c3d4"},
			{UUID: NewUUID(), State: DiskSpare, Size: 1 << 30}},
		Extents: []ExtentEntry{
			{Volume: NewUUID(), Offset: 1 << 20, Length: 33 << 20, VolumeSize: 64 << 20, Epoch: 2, Role: 1, Members: 4, Name: "pvc-1234"},
			{Volume: NewUUID(), Offset: 40 << 20, Length: 2 << 20, VolumeSize: 2 << 20, Epoch: 1, Role: 0, Members: 2, Name: "x"},
		},
	}
	for i := range l.Extents {
		x := &l.Extents[i]
		for r := range x.Members {
			u := NewUUID()
			if r == x.Role {
				u = l.Disk
			}
			x.MemberDisks = append(x.MemberDisks, u)
		}
	}
	return l
}

func TestLabelRoundTrip(t *testing.T) {
	l := sampleLabel()
	b, err := l.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != LabelSlotSize || string(b[:8]) != "R10POOL\x00" {
		t.Fatalf("slot image: %d bytes, magic %q", len(b), b[:8])
	}
	got, err := DecodeLabel(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, l) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, l)
	}
}

func TestLabelDecodeErrors(t *testing.T) {
	good, _ := sampleLabel().Encode()
	n := sampleLabel().encodedLen()
	mut := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	overlap := sampleLabel()
	overlap.Extents[1].Offset = 2 << 20
	overlapB, _ := overlap.Encode() // Encode does not check; DecodeLabel must
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"zeroes", make([]byte, LabelSlotSize), errNoLabel},
		{"short", good[:100], errNoLabel},
		{"flipped bit in an extent", mut(func(b []byte) { b[labelHeaderSize+2*diskEntrySize+20] ^= 1 }), ErrCorruptLabel},
		{"flipped bit in a member map", mut(func(b []byte) { b[n-5] ^= 1 }), ErrCorruptLabel},
		{"flipped checksum", mut(func(b []byte) { b[n] ^= 0x80 }), ErrCorruptLabel},
		{"length past the slot", mut(func(b []byte) { b[12], b[13], b[14] = 0xff, 0xff, 0x7f }), ErrCorruptLabel},
		{"newer version", mut(func(b []byte) { b[8] = 3 }), ErrLabelVersion},
		{"overlapping extents", overlapB, ErrCorruptLabel},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := DecodeLabel(c.b); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

func FuzzDecodeLabel(f *testing.F) {
	good, _ := sampleLabel().Encode()
	f.Add(good[:sampleLabel().encodedLen()+4])
	f.Add(good[:300])
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := DecodeLabel(b)
		if err == nil {
			if _, err := l.Encode(); err != nil {
				t.Fatalf("a decoded label does not encode: %v", err)
			}
		}
	})
}

// TestTornLabelWrite tears the newest label slot of a disk, as a crash during that write
// would: the pool falls back to the previous generation there. The torn write was the last
// step of a create that never returned, so that volume is rolled back; the others are
// intact.
func TestTornLabelWrite(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(paths...)
	p := openPool(t, cfg)
	for _, n := range []string{"v", "w", "x"} {
		if _, err := p.CreateVolume(n, 16<<20, CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "v", data, 0)
	p.Close()

	// The newest slot of disk 0 is the write that cleared x's creating flag; tear it.
	f, err := os.Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	ls := readLabel(f)
	f.Close()
	poke(t, paths[0], int64(ls.slot)*LabelSlotSize+labelHeaderSize+10, []byte("torn write"))

	p = openPool(t, cfg)
	defer p.Close()
	if d := diskByPath(t, p, paths[0]); d.Status != StatusActive || d.Extents != 2 {
		t.Fatalf("disk with a torn slot: %+v", d)
	}
	if _, err := p.Volume("x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("volume x, whose create was torn: %v", err)
	}
	for _, n := range []string{"v", "w"} {
		if vi, err := p.Volume(n); err != nil || vi.Health != Healthy {
			t.Fatalf("volume %s: %+v %v", n, vi, err)
		}
	}
	checkVolume(t, p, "v", data, 0)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestCorruptLabels: a disk whose both slots are corrupt is refused (its bytes untouched)
// and its volumes start degraded; with wipe it is reclaimed as a blank disk.
func TestCorruptLabels(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, 64<<20)
	cfg := configFor(paths...)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 32<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "v", data, 3<<20)
	p.Close()
	for s := range 2 {
		poke(t, paths[3], int64(s)*LabelSlotSize+40, []byte("garbage"))
	}
	before := hashFile(t, paths[3])

	p = openPool(t, cfg)
	d := diskByPath(t, p, paths[3])
	if d.Status != StatusRefused || !strings.Contains(d.Reason, "corrupt pool label") {
		t.Fatalf("corrupt disk: %+v", d)
	}
	waitHealth(t, p, "v", Degraded)
	checkVolume(t, p, "v", data, 3<<20)
	p.Close()
	if hashFile(t, paths[3]) != before {
		t.Fatal("a refused disk was written")
	}

	cfg.Disks[3].Wipe = true
	p = openPool(t, cfg)
	defer p.Close()
	if d := diskByPath(t, p, paths[3]); d.Status != StatusActive || d.Extents != 0 {
		t.Fatalf("wiped disk: %+v", d)
	}
	vi := waitHealth(t, p, "v", Degraded)
	// The old disk is Missing (its label is gone); the member map still names it.
	var old string
	for _, di := range p.Disks() {
		if di.Status == StatusMissing {
			old = di.UUID
		}
	}
	if old == "" || vi.Members[3].DiskUUID != old || vi.Members[3].State != "missing" {
		t.Fatalf("missing disk %q, members %+v", old, vi.Members)
	}
	if err := p.FailDisk(old); err != nil {
		t.Fatal(err)
	}
	// Disk 0 holds a member of v: not a replacement. The reclaimed disk 3 is.
	if _, err := p.ReplaceDisk(old, DiskConfig{Path: paths[0]}); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("replace onto a disk of the same volume: %v", err)
	}
	if _, err := p.ReplaceDisk(old, DiskConfig{Path: paths[3]}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	checkVolume(t, p, "v", data, 3<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestOneSlotCorruptOtherBlank: a label whose only written slot is corrupt is a corrupt
// label, never a blank disk.
func TestOneSlotCorruptOtherBlank(t *testing.T) {
	img := t.TempDir() + "/img"
	sparse(t, img, 8<<20)
	b, _ := sampleLabel().Encode()
	b[300] ^= 1
	poke(t, img, LabelSlotSize, b) // slot 1 corrupt, slot 0 zero
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = readLabel(f).err()
	if !errors.Is(err, ErrCorruptLabel) || errors.Is(err, errNoLabel) {
		t.Fatalf("got %v", err)
	}
}

// failingReader answers every read with an I/O error, as a dead disk does.
type failingReader struct{}

func (failingReader) ReadAt([]byte, int64) (int, error) { return 0, syscall.EIO }

// TestUnreadableLabelIsNotBlank: a disk whose label area cannot be read is refused as
// unreadable, never taken for a blank disk (which Open would claim: a fresh label over a
// member whose head went bad).
func TestUnreadableLabelIsNotBlank(t *testing.T) {
	err := readLabel(failingReader{}).err()
	if !errors.Is(err, ErrLabelUnreadable) || errors.Is(err, errNoLabel) || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("got %v, want ErrLabelUnreadable naming the I/O error", err)
	}
}

// TestReplaceRefusedDisk: naming a listed disk the pool refused (here one with another
// filesystem's signature) as the disk to replace is an error that says so, not a success
// that rebuilds nothing; the missing member is replaced by its UUID.
func TestReplaceRefusedDisk(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 6, testDiskSize)
	p := openPool(t, configFor(paths[:4]...))
	if _, err := p.CreateVolume("v", 64<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var gone DiskInfo
	for _, d := range p.Disks() {
		if d.Path == paths[1] {
			gone = d
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// The disk of member 1 comes back as something else: refused at the next open.
	if err := os.Truncate(paths[1], 0); err != nil {
		t.Fatal(err)
	}
	sparse(t, paths[1], testDiskSize)
	poke(t, paths[1], 1080, []byte{0x53, 0xef}) // an ext4 superblock magic
	p = openPool(t, configFor(paths[:4]...))
	defer p.Close()
	if vi, err := p.Volume("v"); err != nil || vi.Health != Degraded {
		t.Fatalf("volume after the open: %+v, %v", vi, err)
	}
	_, err := p.ReplaceDisk(paths[1], DiskConfig{Path: paths[4]})
	if !errors.Is(err, ErrFailedPrecondition) || !strings.Contains(err.Error(), "not a member of this pool") {
		t.Fatalf("replace of the refused disk: %v, want FailedPrecondition naming it", err)
	}
	if _, err := p.ReplaceDisk(gone.UUID, DiskConfig{Path: paths[4]}); err != nil {
		t.Fatalf("replace of the missing member by UUID %s: %v", gone.UUID, err)
	}
	waitHealth(t, p, "v", Healthy)
}
