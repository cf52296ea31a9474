package pool

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// readArray reads n bytes from the start of a volume's or snapshot's array.
func readArray(t *testing.T, a *raid10.Array, n int64) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := a.ReadAt(b, 0); err != nil {
		t.Fatalf("read: %v", err)
	}
	return b
}

func snapArray(t *testing.T, p *Pool, name string) *raid10.Array {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.snaps[name]
	if v == nil || v.arr == nil {
		t.Fatalf("snapshot %s has no array", name)
	}
	return v.arr
}

func waitSnapshotReady(t *testing.T, p *Pool, name string) SnapshotInfo {
	t.Helper()
	var si SnapshotInfo
	waitUntil(t, time.Minute, func() (bool, string) {
		var err error
		if si, err = p.Snapshot(name); err != nil {
			t.Fatal(err)
		}
		if si.Health == Failed {
			t.Fatalf("snapshot %s failed: %+v", name, si)
		}
		return si.Ready, fmt.Sprintf("snapshot %s not ready: %+v", name, si)
	})
	if si.Copied != si.Size {
		t.Fatalf("snapshot %s ready with %d of %d bytes copied", name, si.Copied, si.Size)
	}
	return si
}

func waitHydrated(t *testing.T, p *Pool, name string) VolumeInfo {
	t.Helper()
	var vi VolumeInfo
	waitUntil(t, time.Minute, func() (bool, string) {
		vi = volumeInfo(t, p, name)
		return vi.Hydrated, fmt.Sprintf("volume %s not hydrated: %+v", name, vi)
	})
	return vi
}

func sum(b []byte) [32]byte { return sha256.Sum256(b) }

// restoreCloneSize is the size of TestSnapshotRestoreClone's volume.
const restoreCloneSize = 16 << 20

// TestSnapshotRestoreClone: a snapshot holds the volume as of the cut while the volume is
// rewritten during the copy; a restore (larger than the snapshot: the tail reads zero) and
// a clone of the live volume hold their sources as of their creation while the sources keep
// changing; all of it survives a restart in the middle of the copies (the hooks go back in
// at Open), deleting in any order frees every byte.
func TestSnapshotRestoreClone(t *testing.T) {
	dir := t.TempDir()
	makeDisks(t, dir, 4, 128<<20)
	cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}, RebuildRateMax: 16 << 20}
	p := openPool(t, cfg)
	defer func() { p.Close() }()
	start := p.Capacity()
	const size = restoreCloneSize
	if _, err := p.CreateVolume("v", size, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := randBytes(size)
	writeVolume(t, p, "v", a, 0)
	si, err := p.CreateSnapshot("s", "v")
	if err != nil {
		t.Fatal(err)
	}
	if si.Ready || si.Source != "v" || si.Size != size || si.CutAt.IsZero() {
		t.Fatalf("snapshot just cut: %+v", si)
	}
	if again, err := p.CreateSnapshot("s", "v"); err != nil || again.UUID != si.UUID || !again.CutAt.Equal(si.CutAt) {
		t.Fatalf("idempotent create: %+v %v", again, err)
	}
	// The volume changes under the copy.
	b := randBytes(size)
	writeVolume(t, p, "v", b, 0)
	// A restore from the snapshot while the snapshot's own copy may still run, larger
	// than it, and a clone of the live volume.
	if _, err := p.CreateVolume("r", size+8<<20, CreateOptions{Source: &Source{Snapshot: "s"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVolume("c", size, CreateOptions{Source: &Source{Volume: "v"}}); err != nil {
		t.Fatal(err)
	}
	if vi, _ := p.Volume("c"); vi.Source == nil || vi.Source.Volume != "v" {
		t.Fatalf("clone's source: %+v", vi.Source)
	}
	checkCopyIdempotent(t, p)
	c := randBytes(size / 2)
	writeVolume(t, p, "v", c, size/4)
	// A restart in the middle: the copies resume from their records.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, cfg)
	writeVolume(t, p, "v", randBytes(1<<20), 0) // under the resumed hooks
	ra := checkCopiesHold(t, p, a, b)
	// Independent: the sources go, the copies stay.
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	// The snapshot keeps its source's name; a retry of its create still answers it.
	if si, err := p.CreateSnapshot("s", "v"); err != nil || si.Source != "v" || !si.Ready {
		t.Fatalf("snapshot of a deleted volume, created again: %+v %v", si, err)
	}
	if _, err := p.CreateSnapshot("s", "w"); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("snapshot name again with another (unknown) source: %v", err)
	}
	if err := p.DeleteSnapshot("s"); err != nil {
		t.Fatal(err)
	}
	if sum(readArray(t, ra, size)) != sum(a) {
		t.Fatal("restore changed when its snapshot went")
	}
	if err := p.DeleteVolume("c"); err != nil { // room for r to grow in place
		t.Fatal(err)
	}
	// A restored volume grows like any other (its old copy record becomes zeroes).
	if _, err := p.ExpandVolume("r", size+16<<20); err != nil {
		t.Fatal(err)
	}
	got := readArray(t, ra, size+16<<20)
	if sum(got[:size]) != sum(a) || !bytes.Equal(got[size:], make([]byte, 16<<20)) {
		t.Fatal("grown restore: data or zero tail wrong")
	}
	if err := p.DeleteVolume("r"); err != nil {
		t.Fatal(err)
	}
	checkFreed(t, p, start)
}

// TestSnapshotBadInputAndOrder: every bad request is refused with its error and allocates
// nothing; deletes in every order while copies run.
func TestSnapshotBadInputAndOrder(t *testing.T) {
	dir := t.TempDir()
	makeDisks(t, dir, 2, 96<<20)
	cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}, RebuildRateMax: 4 << 20}
	p := openPool(t, cfg)
	defer p.Close()
	start := p.Capacity()
	if _, err := p.CreateVolume("v", 32<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	withV := p.Capacity()
	refuseBadCopyRequests(t, p)
	// The first snapshot fits (2 x 96 MiB disks: 32 MiB volume + 33 MiB snapshot); the
	// second does not: ErrNoSpace, nothing allocated.
	if _, err := p.CreateSnapshot("s", "v"); err != nil {
		t.Fatal(err)
	}
	withS := p.Capacity()
	if _, err := p.CreateSnapshot("s2", "v"); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("snapshot without room: %v", err)
	}
	if got := p.Capacity(); got != withS {
		t.Fatalf("a refused snapshot allocated: %+v, want %+v", got, withS)
	}
	if _, err := p.CreateVolume("s", 32<<20, CreateOptions{}); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("volume named like a snapshot: %v", err)
	}
	if _, err := p.CreateSnapshot("s", "other"); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("same snapshot name, other source: %v", err)
	}
	// The source cannot go while its snapshot is copied; the snapshot can.
	if si, _ := p.Snapshot("s"); !si.Ready {
		err := p.DeleteVolume("v")
		if !errors.Is(err, ErrFailedPrecondition) {
			t.Fatalf("delete the source of a running copy: %v", err)
		}
		t.Logf("delete the source during the copy: %v", err)
	}
	if err := p.DeleteSnapshot("s"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot("s"); err != nil {
		t.Fatalf("delete a missing snapshot: %v", err)
	}
	if got := p.Capacity(); got != withV {
		t.Fatalf("a deleted snapshot left allocated: capacity %+v, want %+v", got, withV)
	}
	// The volume is free of the hook: writes go on, and it can go.
	writeVolume(t, p, "v", randBytes(1<<20), 0)
	// A snapshot, then a restore from it running: the snapshot cannot go, the restore can.
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateSnapshot("s", "v"); err != nil {
		t.Fatal(err)
	}
	waitSnapshotReady(t, p, "s")
	if _, err := p.CreateVolume("r", 16<<20, CreateOptions{Source: &Source{Snapshot: "s"}}); err != nil {
		t.Fatal(err)
	}
	if vi, _ := p.Volume("r"); !vi.Hydrated {
		err := p.DeleteSnapshot("s")
		if !errors.Is(err, ErrFailedPrecondition) {
			t.Fatalf("delete the snapshot of a running restore: %v", err)
		}
		t.Logf("delete the snapshot during a restore: %v", err)
	}
	if err := p.DeleteVolume("r"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteVolume("v"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot("s"); err != nil {
		t.Fatal(err)
	}
	checkFreed(t, p, start)
}

// checkCopyIdempotent: creating restore "r" (of snapshot "s") again answers it; with
// another source, or none, or asking for plain volume "v" with a source is ErrAlreadyExists.
func checkCopyIdempotent(t *testing.T, p *Pool) {
	t.Helper()
	const size = restoreCloneSize
	r0, _ := p.Volume("r")
	if again, err := p.CreateVolume("r", size+8<<20, CreateOptions{Source: &Source{Snapshot: "s"}}); err != nil || again.UUID != r0.UUID {
		t.Fatalf("restore again: %+v %v", again, err)
	}
	for _, o := range []CreateOptions{{Source: &Source{Volume: "v"}}, {}} {
		if _, err := p.CreateVolume("r", size+8<<20, o); !errors.Is(err, ErrAlreadyExists) {
			t.Fatalf("restore again with source %+v: %v", o.Source, err)
		}
	}
	if _, err := p.CreateVolume("v", size, CreateOptions{Source: &Source{Snapshot: "s"}}); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("plain volume asked for with a source: %v", err)
	}
}

// checkCopiesHold waits for the copies of TestSnapshotRestoreClone and checks what they
// hold: snapshot "s" and restore "r" the volume's first data a (the restore with a zero
// tail), clone "c" its second data b. It returns the restore's array.
func checkCopiesHold(t *testing.T, p *Pool, a, b []byte) *raid10.Array {
	t.Helper()
	const size = restoreCloneSize
	waitSnapshotReady(t, p, "s")
	r := waitHydrated(t, p, "r")
	cl := waitHydrated(t, p, "c")
	if r.Copied != size || r.Source == nil || r.Source.Snapshot != "s" || cl.Copied != size {
		t.Fatalf("restore %+v, clone %+v", r, cl)
	}
	if sum(readArray(t, snapArray(t, p, "s"), size)) != sum(a) {
		t.Fatal("snapshot does not hold the volume as of the cut")
	}
	ra, _ := p.Array("r")
	got := readArray(t, ra, size+8<<20)
	if sum(got[:size]) != sum(a) || !bytes.Equal(got[size:], make([]byte, 8<<20)) {
		t.Fatal("restore does not hold the snapshot, or its tail is not zero")
	}
	ca, _ := p.Array("c")
	if sum(readArray(t, ca, size)) != sum(b) {
		t.Fatal("clone does not hold the volume as of its creation")
	}
	if n := len(p.Status().Snapshots); n != 1 {
		t.Fatalf("status lists %d snapshots", n)
	}
	return ra
}

// checkFreed checks that the pool's capacity is back at start and that Check passes.
func checkFreed(t *testing.T, p *Pool, start Capacity) {
	t.Helper()
	if got := p.Capacity(); got != start {
		t.Fatalf("capacity %+v, started at %+v", got, start)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// refuseBadCopyRequests makes bad snapshot, restore and clone requests against volume "v"
// of 32 MiB: each is refused with its error and allocates nothing.
func refuseBadCopyRequests(t *testing.T, p *Pool) {
	t.Helper()
	withV := p.Capacity()
	same := func(what string) {
		t.Helper()
		if got := p.Capacity(); got != withV {
			t.Fatalf("%s allocated: capacity %+v, want %+v", what, got, withV)
		}
	}
	for _, c := range []struct {
		what string
		err  error
		do   func() error
	}{
		{"snapshot of an unknown volume", ErrNotFound, func() error { _, err := p.CreateSnapshot("s", "nope"); return err }},
		{"bad snapshot name", ErrInvalidArgument, func() error { _, err := p.CreateSnapshot("-x", "v"); return err }},
		{"snapshot named like a volume", ErrAlreadyExists, func() error { _, err := p.CreateSnapshot("v", "v"); return err }},
		{"restore of an unknown snapshot", ErrNotFound, func() error {
			_, err := p.CreateVolume("r", 32<<20, CreateOptions{Source: &Source{Snapshot: "nope"}})
			return err
		}},
		{"clone smaller than its source", ErrInvalidArgument, func() error {
			_, err := p.CreateVolume("r", 16<<20, CreateOptions{Source: &Source{Volume: "v"}})
			return err
		}},
		{"two sources", ErrInvalidArgument, func() error {
			_, err := p.CreateVolume("r", 32<<20, CreateOptions{Source: &Source{Volume: "v", Snapshot: "s"}})
			return err
		}},
		{"no source named", ErrInvalidArgument, func() error {
			_, err := p.CreateVolume("r", 32<<20, CreateOptions{Source: &Source{}})
			return err
		}},
	} {
		if err := c.do(); !errors.Is(err, c.err) {
			t.Fatalf("%s: %v, want %v", c.what, err, c.err)
		} else {
			t.Logf("%s: %v", c.what, err)
		}
		same(c.what)
	}
}

// TestSnapshotCreateCrash: a create stopped after the cut but before its flags were
// cleared is rolled back at Open (the caller never saw it); the volume is unharmed and a
// retry works.
func TestSnapshotCreateCrash(t *testing.T) {
	for _, point := range []string{"create.first-label", "create.cut", "create.clear-flag-0"} {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			makeDisks(t, dir, 2, 96<<20)
			cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}}
			p := openPool(t, cfg)
			if _, err := p.CreateVolume("v", 16<<20, CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			data := randBytes(16 << 20)
			writeVolume(t, p, "v", data, 0)
			withV := p.Capacity()
			hit := false
			p.failpoint = crashAt(point, &hit)
			if _, err := p.CreateSnapshot("s", "v"); !hit || !errors.Is(err, errCrash) {
				t.Fatalf("failpoint %s: %v", point, err)
			}
			p.failpoint = nil
			p.Close()
			p = openPool(t, cfg)
			defer p.Close()
			if _, err := p.Snapshot("s"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("snapshot after the crash: %v", err)
			}
			if got := p.Capacity(); got != withV {
				t.Fatalf("capacity %+v, want %+v", got, withV)
			}
			checkVolume(t, p, "v", data, 0)
			if _, err := p.CreateSnapshot("s", "v"); err != nil {
				t.Fatal(err)
			}
			writeVolume(t, p, "v", randBytes(16<<20), 0)
			waitSnapshotReady(t, p, "s")
			if sum(readArray(t, snapArray(t, p, "s"), 16<<20)) != sum(data) {
				t.Fatal("snapshot after the retry")
			}
		})
	}
}

// TestSnapshotDiskFailsDuringCopy: a disk holding members of both the volume and its
// snapshot fails while the copy runs; both degrade, the copy finishes, the snapshot holds the
// volume as of the cut; a replacement rebuilds both (the snapshot is an ordinary array of the
// pool) and the snapshot still reads back the same.
func TestSnapshotDiskFailsDuringCopy(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, 96<<20)
	cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}, RebuildRateMax: 8 << 20}
	p := openPool(t, cfg)
	defer func() { p.Close() }()
	const size = 16 << 20
	if _, err := p.CreateVolume("v", size, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := randBytes(size)
	writeVolume(t, p, "v", a, 0)
	if _, err := p.CreateSnapshot("s", "v"); err != nil {
		t.Fatal(err)
	}
	if err := p.FailDisk(paths[0]); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, p, "v", randBytes(size), 0)
	si := waitSnapshotReady(t, p, "s")
	if si.Health != Degraded {
		t.Fatalf("snapshot with a failed disk: %+v", si)
	}
	if sum(readArray(t, snapArray(t, p, "s"), size)) != sum(a) {
		t.Fatal("snapshot after a disk failed during its copy")
	}
	sparse(t, filepath.Join(dir, "disk9.img"), 96<<20)
	if _, err := p.ReplaceDisk(paths[0], DiskConfig{Path: filepath.Join(dir, "disk9.img")}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	waitUntil(t, time.Minute, func() (bool, string) {
		si, _ := p.Snapshot("s")
		return si.Health == Healthy, fmt.Sprintf("snapshot not rebuilt: %+v", si)
	})
	if sum(readArray(t, snapArray(t, p, "s"), size)) != sum(a) {
		t.Fatal("snapshot after its rebuild")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, cfg)
	if si, err := p.Snapshot("s"); err != nil || !si.Ready || si.Health != Healthy || si.Source != "v" {
		t.Fatalf("snapshot after a restart: %+v %v", si, err)
	}
	if sum(readArray(t, snapArray(t, p, "s"), size)) != sum(a) {
		t.Fatal("snapshot after a restart")
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotAbsentAtOpen: the pool opens without the disks of a snapshot whose copy was
// running and serves its volume (without the hook: the snapshot is not there). When the
// disks come back the snapshot is Failed, never resumed from a bitmap that no longer says
// what the volume holds; restoring it is refused, deleting it works.
func TestSnapshotAbsentAtOpen(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, 96<<20)
	all := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}, RebuildRateMax: 1 << 20}
	p := openPool(t, all)
	if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2}); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, p, "v", randBytes(16<<20), 0)
	if _, err := p.CreateSnapshot("s", "v"); err != nil {
		t.Fatal(err)
	}
	vi, _ := p.Volume("v")
	p.mu.Lock()
	var snapDisks []string
	for _, r := range p.snaps["s"].roles {
		snapDisks = append(snapDisks, r.disk.path)
	}
	p.mu.Unlock()
	for _, m := range vi.Members {
		for _, d := range snapDisks {
			if m.DiskPath == d {
				t.Fatalf("test set-up: the snapshot shares disk %s with its volume", d)
			}
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Only the volume's disks.
	var only []string
	for _, m := range vi.Members {
		only = append(only, m.DiskPath)
	}
	p = openPool(t, Config{Disks: configFor(only...).Disks, RebuildRateMax: 1 << 20})
	writeVolume(t, p, "v", randBytes(16<<20), 0)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, all)
	defer p.Close()
	si, err := p.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	if si.Ready || si.Health != Failed {
		t.Fatalf("snapshot whose volume was served without it: %+v", si)
	}
	t.Logf("snapshot after its disks came back: health %s, %s", si.Health, si.Reason)
	if _, err := p.CreateVolume("r", 16<<20, CreateOptions{Source: &Source{Snapshot: "s"}}); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("restore of a failed snapshot: %v", err)
	}
	if err := p.DeleteSnapshot("s"); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, p, "v", randBytes(1<<20), 0)
	_ = paths
}
