package pool

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// faultyExtent is a FaultyMember over an extent that still grows in place.
type faultyExtent struct {
	*raid10.FaultyMember
	ext *raid10.ExtentMember
}

func (f faultyExtent) Resize(n int64) error { return f.ext.Resize(n) }

// faultyPool opens a pool on n file disks whose new volumes' members are
// raid10.FaultyMembers, returned in creation order.
func faultyPool(t *testing.T, n int, cfg func(*Config)) (*Pool, *[]*raid10.FaultyMember) {
	t.Helper()
	c := configFor(makeDisks(t, t.TempDir(), n, testDiskSize)...)
	if cfg != nil {
		cfg(&c)
	}
	p := openPool(t, c)
	var fs []*raid10.FaultyMember
	p.mu.Lock()
	p.wrapMember = func(m raid10.Member) raid10.Member {
		f := raid10.NewFaultyMember(m)
		fs = append(fs, f)
		return faultyExtent{f, m.(*raid10.ExtentMember)}
	}
	p.mu.Unlock()
	return p, &fs
}

// TestLostBlockThroughPool: a block unreadable on both copies of a real array reads as EIO;
// the pool reports it lost and bad on both members, and the volume Degraded with every
// member in sync and its disks Active; a write makes it good and the volume Healthy again.
func TestLostBlockThroughPool(t *testing.T) {
	p, fs := faultyPool(t, 2, nil)
	defer p.Close()
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "v", data, 0)
	a, err := p.Array("v")
	if err != nil {
		t.Fatal(err)
	}
	// Two members: every block is on both, at the same member offset. Make the data area
	// (after the engine's metadata head, extentMetaSize) unreadable on both, read one
	// block, and clear the faults. The superblocks stay readable: a member whose
	// superblock cannot be read either is failed as a whole instead.
	for _, f := range *fs {
		f.FailRange(extentMetaSize, f.Size()-extentMetaSize, true, false)
	}
	buf := make([]byte, raid10.BlockSize)
	_, err = a.ReadAt(buf, 8*raid10.BlockSize)
	for _, f := range *fs {
		f.ClearFaults()
	}
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a block without a readable copy: %v, want EIO", err)
	}
	vi, err := p.Volume("v")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the read: health %s, bad %d, lost %d, members %+v", vi.Health, vi.BadBlocks, vi.LostBlocks, vi.Members)
	if vi.Health != Degraded || vi.LostBlocks != 1 || vi.BadBlocks != 2 || vi.InSync != 2 {
		t.Fatalf("volume %+v", vi)
	}
	for _, m := range vi.Members {
		if m.BadBlocks != 1 || m.State != "in-sync" {
			t.Fatalf("member %+v", m)
		}
	}
	// Only that block fails; the data around it reads back.
	if _, err := a.ReadAt(buf, 8*raid10.BlockSize); !errors.Is(err, syscall.EIO) {
		t.Fatalf("second read of the lost block: %v", err)
	}
	checkVolume(t, p, "v", data[:8*raid10.BlockSize], 0)
	checkVolume(t, p, "v", data[9*raid10.BlockSize:], 9*raid10.BlockSize)
	time.Sleep(2 * monitorInterval) // the monitor fails no disk for a bad block
	for _, d := range p.Disks() {
		if d.Status != StatusActive {
			t.Fatalf("disk %s is %s", d.Path, d.Status)
		}
	}
	// The volume grows with its bad blocks: they stay recorded, the rest reads back.
	if _, err := p.ExpandVolume("v", 32<<20); err != nil {
		t.Fatalf("expand with a lost block: %v", err)
	}
	if vi, err := p.Volume("v"); err != nil || vi.Size != 32<<20 || vi.LostBlocks != 1 || vi.Health != Degraded {
		t.Fatalf("after the expand: %+v %v", vi, err)
	}
	if _, err := a.ReadAt(buf, 8*raid10.BlockSize); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of the lost block after the expand: %v", err)
	}
	checkVolume(t, p, "v", data[9*raid10.BlockSize:], 9*raid10.BlockSize)
	// A write to the block clears the marks.
	writeVolume(t, p, "v", data[8*raid10.BlockSize:9*raid10.BlockSize], 8*raid10.BlockSize)
	if vi := waitHealth(t, p, "v", Healthy); vi.BadBlocks != 0 || vi.LostBlocks != 0 {
		t.Fatalf("after the write: %+v", vi)
	}
	checkVolume(t, p, "v", data, 0)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestMemberTimeoutThroughPool: the pool's memberTimeout reaches the engine: a member that
// stalls is failed within it, the write completes from the other copy, the member's
// timeout count shows in VolumeInfo and the pool marks its disk Failed.
func TestMemberTimeoutThroughPool(t *testing.T) {
	const deadline = 300 * time.Millisecond
	p, fs := faultyPool(t, 2, func(c *Config) { c.MemberTimeout = Duration(deadline) })
	defer p.Close()
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	a, err := p.Array("v")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range *fs {
		f.SetLatency(50 * time.Microsecond) // device latency: the engine hands calls to workers
	}
	buf := randBytes(raid10.BlockSize)
	for i := range 64 { // the engine's latency average learns it
		if _, err := a.WriteAt(buf, int64(i)*raid10.BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	(*fs)[1].Stall()
	defer (*fs)[1].Unstall()
	data := randBytes(8 * raid10.BlockSize)
	start := time.Now()
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatalf("write while member 1 stalls: %v", err)
	}
	took := time.Since(start)
	t.Logf("the write took %v with a %v deadline", took, deadline)
	if took > deadline+2*time.Second {
		t.Fatalf("the write took %v", took)
	}
	vi, err := p.Volume("v")
	if err != nil {
		t.Fatal(err)
	}
	if m := vi.Members[1]; m.State != "faulty" || m.TimedOut != 1 || vi.TimedOut != 1 {
		t.Fatalf("volume %+v", vi)
	}
	checkVolume(t, p, "v", data, 0)
	waitUntil(t, 10*time.Second, func() (bool, string) {
		return diskByPath(t, p, vi.Members[1].DiskPath).Status == StatusFailed,
			fmt.Sprintf("the stalled disk is not marked Failed: %+v", p.Disks())
	})
}
