package pool

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// A write abandoned in a hung disk (the member deadline gave up on it) still holds the
// disk's data path open in the kernel after Close, and after the process has exited, until it
// lands. A successor must not open that disk meanwhile: it would write beside a stale write
// that lands later. The lock lives with the data path's open file, so a reference to it held
// past Close (here a duplicate of its descriptor, as the call in flight holds one) keeps the
// disk refused as in use; the volumes are served degraded from the other copies, and once the
// reference is gone the disk comes back on its own and resyncs what changed.
func TestDiskLockedWhileCallInFlight(t *testing.T) {
	dir := t.TempDir()
	disks := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(disks...)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 32<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	before := randBytes(4 << 20)
	writeVolume(t, p, "v", before, 0)

	// The call in flight on disk 1's data path: a second reference to its open file.
	p.mu.Lock()
	var held int
	for _, d := range p.disks {
		if d.path == disks[1] {
			fm, ok := d.base.(*raid10.FileMember)
			if !ok {
				p.mu.Unlock()
				t.Fatalf("disk %s: data path is %T, want *raid10.FileMember", d.path, d.base)
			}
			var err error
			if held, err = unix.Dup(fm.Fd()); err != nil {
				p.mu.Unlock()
				t.Fatal(err)
			}
		}
	}
	p.mu.Unlock()
	if held == 0 {
		t.Fatalf("disk %s not in the pool", disks[1])
	}
	release := func() {
		if held != 0 {
			_ = unix.Close(held)
			held = 0
		}
	}
	defer release()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// The successor: disk 1 refused as in use, the volume served degraded.
	p = openPool(t, cfg)
	defer p.Close()
	if st := diskStatus(t, p, disks[1]); st.Status != StatusRefused {
		t.Fatalf("disk %s with a call of the previous process in flight: %s (%s), want Refused as in use", disks[1], st.Status, st.Reason)
	}
	vi := volumeInfo(t, p, "v")
	if vi.Health != Degraded {
		t.Fatalf("volume v without disk 1: %s, want Degraded", vi.Health)
	}
	checkVolume(t, p, "v", before, 0)
	after := randBytes(4 << 20)
	writeVolume(t, p, "v", after, 4<<20)

	// The call lands (the reference goes): the disk returns and resyncs.
	release()
	deadline := time.Now().Add(30 * time.Second)
	for diskStatus(t, p, disks[1]).Status != StatusActive {
		if time.Now().After(deadline) {
			st := diskStatus(t, p, disks[1])
			t.Fatalf("disk %s free again but not back after 30 s: %s (%s)", disks[1], st.Status, st.Reason)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitHealth(t, p, "v", Healthy)
	n := 0
	for _, d := range p.Disks() {
		if d.Path == disks[1] {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("disk %s listed %d times, want once", disks[1], n)
	}
	checkVolume(t, p, "v", before, 0)
	checkVolume(t, p, "v", after, 4<<20)

	// Every copy agrees: the returned disk holds the writes it missed.
	p.mu.Lock()
	a := p.byName["v"].arr
	p.mu.Unlock()
	if r, err := a.Check(context.Background()); err != nil || r.Mismatches != 0 || r.Lost != 0 {
		t.Fatalf("check after the return: %+v, %v", r, err)
	}
}

// diskStatus is the pool's view of the disk at path (the last entry naming it).
func diskStatus(t *testing.T, p *Pool, path string) DiskInfo {
	t.Helper()
	var out DiskInfo
	found := false
	for _, d := range p.Disks() {
		if d.Path == path {
			out, found = d, true
		}
	}
	if !found {
		t.Fatalf("disk %s not listed", path)
	}
	return out
}
