package pool

import (
	"bytes"
	"errors"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestSpareSkipsUnassembledVolume: a disk of a volume whose assembly was refused (the
// state raid10.Assemble leaves when a member does not answer in time, TestAssembleHungMember;
// set here directly) is failed with a hot spare configured. The spare takes no role of
// that volume: moved onto an extent without a superblock, the role would make every later
// assembly refuse the volume ("no superblock"), Failed for good. The role stays on the
// failed disk, Missing after a restart, and the volume assembles Degraded from the other
// member with its data.
func TestSpareSkipsUnassembledVolume(t *testing.T) {
	paths := makeDisks(t, t.TempDir(), 3, testDiskSize)
	c := configFor(paths...)
	c.Disks[2].Spare = true
	p := openPool(t, c)
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "v", data, 0)
	p.mu.Lock()
	v := p.byName["v"]
	if err := v.arr.Close(); err != nil {
		t.Fatal(err)
	}
	v.arr, v.err = nil, errors.New("refused: member 1 did not answer its superblock read")
	failed := v.roles[1].disk.path
	p.mu.Unlock()
	if err := p.FailDisk(failed); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, c)
	defer p.Close()
	vi, err := p.Volume("v")
	if err != nil {
		t.Fatal(err)
	}
	if vi.Health != Degraded || vi.Reason != "" {
		t.Fatalf("after the restart: health %s (%s), want Degraded", vi.Health, vi.Reason)
	}
	if st := vi.Members[1].State; st != raid10.MemberMissing.String() {
		t.Fatalf("member 1 %s, want missing", st)
	}
	a, err := p.Array("v")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after the restart: %v, data equal %v", err, bytes.Equal(got, data))
	}
}
