package pool

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const testDiskSize = 256 << 20

// makeDisks creates n sparse files of size bytes and returns their paths.
func makeDisks(t *testing.T, dir string, n int, size int64) []string {
	t.Helper()
	var paths []string
	for i := range n {
		p := filepath.Join(dir, "disk"+string(rune('0'+i))+".img")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		f.Close()
		paths = append(paths, p)
	}
	return paths
}

func configFor(paths ...string) Config {
	var c Config
	for _, p := range paths {
		c.Disks = append(c.Disks, DiskConfig{Path: p})
	}
	return c
}

func openPool(t *testing.T, c Config) *Pool {
	t.Helper()
	p, err := Open(c)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return p
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// writeVolume writes data at off through the volume's array and flushes.
func writeVolume(t *testing.T, p *Pool, name string, data []byte, off int64) {
	t.Helper()
	a, err := p.Array(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt(data, off); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := a.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

func checkVolume(t *testing.T, p *Pool, name string, want []byte, off int64) {
	t.Helper()
	a, err := p.Array(name)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := a.ReadAt(got, off); err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("volume %s: data at %d differs", name, off)
	}
}

// waitUntil calls cond every 20 ms until it reports done, and fails the test with the state
// cond last described once limit has passed.
func waitUntil(t *testing.T, limit time.Duration, cond func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		done, state := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// volumeInfo describes volume name.
func volumeInfo(t *testing.T, p *Pool, name string) VolumeInfo {
	t.Helper()
	vi, err := p.Volume(name)
	if err != nil {
		t.Fatal(err)
	}
	return vi
}

func waitHealth(t *testing.T, p *Pool, name string, want Health) VolumeInfo {
	t.Helper()
	var vi VolumeInfo
	waitUntil(t, time.Minute, func() (bool, string) {
		vi = volumeInfo(t, p, name)
		return vi.Health == want, fmt.Sprintf("volume %s: health %s, waited for %s", name, vi.Health, want)
	})
	return vi
}

func diskByPath(t *testing.T, p *Pool, path string) DiskInfo {
	t.Helper()
	for _, d := range p.Disks() {
		if d.Path == path {
			return d
		}
	}
	t.Fatalf("no disk %s", path)
	return DiskInfo{}
}

func TestRestartReassembles(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(paths...)
	p := openPool(t, cfg)
	vi, err := p.CreateVolume("vol-a", 64<<20, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if vi.Health != Healthy || len(vi.Members) != 4 {
		t.Fatalf("new volume: %+v", vi)
	}
	if _, err := p.CreateVolume("vol-b", 10<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "vol-a", data, 5<<20)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p = openPool(t, cfg)
	defer p.Close()
	vs := p.Volumes()
	if len(vs) != 2 || vs[0].Name != "vol-a" || vs[1].Name != "vol-b" || vs[0].Size != 64<<20 {
		t.Fatalf("after restart: %+v", vs)
	}
	for _, v := range vs {
		if v.Health != Healthy {
			t.Fatalf("volume %s is %s after a clean restart", v.Name, v.Health)
		}
	}
	checkVolume(t, p, "vol-a", data, 5<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestDegradedStartAndReturn(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(paths...)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 64<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := randBytes(2 << 20)
	writeVolume(t, p, "v", before, 0)
	p.Close()

	// Start without disk 2 (moved away): degraded, data intact.
	hidden := paths[2] + ".away"
	if err := os.Rename(paths[2], hidden); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, cfg)
	vi := waitHealth(t, p, "v", Degraded)
	if vi.InSync != 3 {
		t.Fatalf("degraded start: %d in sync, want 3", vi.InSync)
	}
	missing := 0
	for _, d := range p.Disks() {
		if d.Status == StatusMissing {
			missing++
		}
	}
	if missing != 1 {
		t.Fatalf("want one Missing disk: %+v", p.Disks())
	}
	checkVolume(t, p, "v", before, 0)
	after := randBytes(1 << 20)
	writeVolume(t, p, "v", after, 32<<20)

	// The disk comes back at run time: re-added, only changed regions resynced.
	if err := os.Rename(hidden, paths[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AddDisk(DiskConfig{Path: paths[2]}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	checkVolume(t, p, "v", before, 0)
	checkVolume(t, p, "v", after, 32<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	p.Close()
}

func TestFailReplaceAndSpare(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 6, testDiskSize)
	cfg := configFor(paths[:4]...)
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: paths[4], Spare: true})
	p := openPool(t, cfg)
	defer p.Close()
	if d := diskByPath(t, p, paths[4]); d.Status != StatusSpare {
		t.Fatalf("spare: %+v", d)
	}
	if _, err := p.CreateVolume("v", 96<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(4 << 20)
	writeVolume(t, p, "v", data, 1<<20)

	// Fail disk 1: the spare takes over and the volume rebuilds.
	if err := p.FailDisk(paths[1]); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	if d := diskByPath(t, p, paths[4]); d.Status != StatusActive || d.Extents != 1 {
		t.Fatalf("spare after failure: %+v", d)
	}
	checkVolume(t, p, "v", data, 1<<20)

	// Fail disk 2: no spare left, degraded; replacing an active disk is refused.
	if err := p.FailDisk(paths[2]); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Degraded)
	if _, err := p.ReplaceDisk(paths[3], DiskConfig{Path: paths[5]}); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("replace of an active disk: %v", err)
	}
	if _, err := p.ReplaceDisk(paths[2], DiskConfig{Path: paths[5]}); err != nil {
		t.Fatal(err)
	}
	sawProgress := false
	waitUntil(t, time.Minute, func() (bool, string) {
		vi, _ := p.Volume("v")
		if vi.Sync != nil && vi.Sync.Total > 0 {
			sawProgress = true
		}
		return vi.Health == Healthy, fmt.Sprintf("no rebuild: %+v", vi)
	})
	t.Logf("saw rebuild progress: %v", sawProgress)
	checkVolume(t, p, "v", data, 1<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	// A replaced disk is reused only when wiped: then it comes back as a new spare.
	if d, err := p.AddDisk(DiskConfig{Path: paths[1]}); err != nil || d.Status != StatusRemoved {
		t.Fatalf("re-offering a replaced disk: %+v %v", d, err)
	}
	if d, err := p.AddDisk(DiskConfig{Path: paths[1], Wipe: true, Spare: true}); err != nil || d.Status != StatusSpare || d.Extents != 0 {
		t.Fatalf("re-offering a replaced disk with wipe: %+v %v", d, err)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	p.Close()

	// After a restart the replaced disks stay out and the volume is healthy on its new ones.
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: paths[5]})
	p = openPool(t, cfg)
	vi := waitHealth(t, p, "v", Healthy)
	for _, m := range vi.Members {
		if m.DiskPath == paths[1] || m.DiskPath == paths[2] {
			t.Fatalf("replaced disk back in the volume: %+v", vi)
		}
	}
	checkVolume(t, p, "v", data, 1<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestReturningDiskResyncsOnlyChanges: a disk missing at start comes back; the engine's
// bitmap limits the resync to the region written while it was away.
func TestReturningDiskResyncsOnlyChanges(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(paths...)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 224<<20, CreateOptions{}); err != nil { // 4 bitmap regions of 64 MiB
		t.Fatal(err)
	}
	base := randBytes(8 << 20)
	writeVolume(t, p, "v", base, 0)
	p.Close()

	if err := os.Rename(paths[2], paths[2]+".away"); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, cfg)
	defer p.Close()
	waitHealth(t, p, "v", Degraded)
	delta := randBytes(1 << 20)
	writeVolume(t, p, "v", delta, 100<<20) // region 1 only
	if err := os.Rename(paths[2]+".away", paths[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AddDisk(DiskConfig{Path: paths[2]}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	a, _ := p.Array("v")
	last := a.Status().Sync
	full := int64(224<<20) / 2 // a full rebuild copies every chunk with a copy on the member: half the volume
	if last.Total == 0 || last.Total > full/2 {
		t.Fatalf("resync after a short absence visited %d bytes; a full rebuild visits %d", last.Total, full)
	}
	t.Logf("resync visited %d bytes (full rebuild: %d)", last.Total, full)
	checkVolume(t, p, "v", base, 0)
	checkVolume(t, p, "v", delta, 100<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestReaddFailedDisk: an operator fails a disk (e.g. a cable pulled), it works again and is
// re-added: only what changed meanwhile is copied.
func TestReaddFailedDisk(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	p := openPool(t, configFor(paths...))
	defer p.Close()
	if _, err := p.CreateVolume("v", 224<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ReaddDisk(paths[1]); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("re-add of an active disk: %v", err)
	}
	if err := p.FailDisk(paths[1]); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Degraded)
	delta := randBytes(1 << 20)
	writeVolume(t, p, "v", delta, 150<<20)
	if _, err := p.ReaddDisk(paths[1]); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	a, _ := p.Array("v")
	if last := a.Status().Sync; last.Total == 0 || last.Total > 56<<20 {
		t.Fatalf("re-add visited %d bytes", last.Total)
	}
	checkVolume(t, p, "v", delta, 150<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestSpareAtStart: a disk recorded as failed and a spare configured since: the spare takes
// over when the pool opens.
func TestSpareAtStart(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 5, 96<<20)
	cfg := configFor(paths[:4]...)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 32<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "v", data, 0)
	if err := p.FailDisk(paths[2]); err != nil {
		t.Fatal(err)
	}
	p.Close()
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: paths[4], Spare: true})
	p = openPool(t, cfg)
	defer p.Close()
	waitHealth(t, p, "v", Healthy)
	if d := diskByPath(t, p, paths[4]); d.Status != StatusActive {
		t.Fatalf("spare: %+v", d)
	}
	if d := diskByPath(t, p, paths[2]); d.Status != StatusRemoved {
		t.Fatalf("failed disk: %+v", d)
	}
	checkVolume(t, p, "v", data, 0)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}
