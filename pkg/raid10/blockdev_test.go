package raid10

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// loopDevice attaches a new loop device over a sparse file of size bytes
// and detaches it at cleanup. It fails the test when that is impossible,
// unless RAID10_SKIP_HEAVY is set (make unit): skipping real devices is an
// explicit choice, never a silent one.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	testenv.Heavy(t, "needs loop devices")
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s (needs root and loop devices; set RAID10_SKIP_HEAVY=1 to skip)", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// TestBlockDeviceMembers runs an array over two loop devices: direct I/O,
// size from the device, BLKZEROOUT and BLKDISCARD, close and assemble.
func TestBlockDeviceMembers(t *testing.T) {
	var ms []Member
	var paths []string
	for i := 0; i < 2; i++ {
		dev := loopDevice(t, 16<<20)
		m, err := OpenFileMember(dev)
		if err != nil {
			t.Fatal(err)
		}
		if !m.block || m.Size() != 16<<20 {
			t.Fatalf("%s: block %v, size %d", dev, m.block, m.Size())
		}
		t.Logf("%s: direct I/O %v", dev, m.Direct())
		ms = append(ms, m)
		paths = append(paths, dev)
	}
	a, err := Create(ms, CreateOptions{Options: testOpts(), ChunkSize: testChunk, RegionSize: 1 << 20, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	p := AlignedBuffer(256 << 10)
	for i := range p {
		p[i] = byte(i % 251)
	}
	if _, err := a.WriteAt(p, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := a.WriteZeroes(1<<20, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := a.Discard(2<<20, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	want := append(make([]byte, 64<<10), p[64<<10:]...)
	got := AlignedBuffer(len(p))
	if _, err := a.ReadAt(got, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back differs after write-zeroes")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ms = ms[:0]
	for _, dev := range paths {
		m, err := OpenFileMember(dev)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	b, err := Assemble(ms, AssembleOptions{Options: testOpts()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back after assemble: %v", err)
	}
	// The discarded range may read as anything, but the copies must agree
	// after a repair; a loop device over a sparse file reads zeroes there.
	if _, err := b.Repair(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Check(context.Background()); err != nil || res.Mismatches != 0 {
		t.Fatalf("check: %+v %v", res, err)
	}
}
