package pool

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLateSourceResumesCopies: a volume whose assembly was refused at Open (two of its
// three disks absent), so that the copy into its snapshot could not resume, is assembled
// late when its disks come back (AddDisk), and then rewritten whole.
//   - TargetPresent: the snapshot's copy resumes there, before the volume is served: the
//     snapshot holds the volume as of its cut, at once (hydrated on read) and after a
//     restart that lets the copier finish.
//   - TargetAbsent: the snapshot's disks are absent too: the volume's copy generation
//     moves on at its late assembly, and when the snapshot's disks are back at the next
//     Open its record is refused: the snapshot is Failed, never Ready.
//
// Without the resume (or the generation) the volume is served without the
// copy-before-write hook and the next Open's copier fills the snapshot from the rewritten
// volume, which then reads Ready.
func TestLateSourceResumesCopies(t *testing.T) {
	const size = 16 << 20
	t.Run("TargetPresent", func(t *testing.T) {
		p, _, _, absent := stoppedCopy(t, false)
		defer func() { p.Close() }()
		cut := lateSourceRewritten(t, p, absent)
		// Its copy resumed: running, or already done on a fast machine (a CI run's copier
		// finished the 16 MiB before this look). Without the resume it would neither run
		// nor hold the cut (the read below).
		if si, err := p.Snapshot("s"); err != nil || si.Health == Failed {
			t.Errorf("snapshot once its source is assembled: %+v, %v: want its copy running or done", si, err)
		}
		if !bytes.Equal(readArray(t, snapArray(t, p, "s"), size), cut) {
			t.Error("snapshot after its source, assembled late, was rewritten: it does not hold the cut")
		}
		p = reopenAll(t, p, absent[0])
		si := waitSnapshotReady(t, p, "s")
		if !bytes.Equal(readArray(t, snapArray(t, p, "s"), size), cut) {
			t.Fatalf("snapshot after a restart (%+v): it does not hold the cut", si)
		}
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("TargetAbsent", func(t *testing.T) {
		p, _, _, absent := stoppedCopy(t, false)
		defer func() { p.Close() }()
		snapDisks := diskPathsOf(t, p, "s")
		all, err := filepath.Glob(filepath.Join(filepath.Dir(absent[0]), "disk*.img"))
		if err != nil {
			t.Fatal(err)
		}
		var third []string // the volume's disk that stayed
		for _, path := range all {
			if !slices.Contains(snapDisks, path) && !slices.Contains(absent, path) {
				third = append(third, path)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		p = openPool(t, Config{Disks: configFor(third...).Disks, RebuildRateMax: 64 << 20})
		lateSourceRewritten(t, p, absent)
		p = reopenAll(t, p, absent[0])
		si, err := p.Snapshot("s")
		if err != nil || si.Ready || si.Health != Failed || !strings.Contains(si.Reason, "failed") {
			t.Fatalf("snapshot whose source was assembled late and served without it: %+v, %v: want Failed", si, err)
		}
		t.Logf("snapshot once its disks are back: %s, %s", si.Health, si.Reason)
	})
}

// lateSourceRewritten brings back absent (volume "v"'s disks), checks that "v" is served,
// and returns what it held before rewriting it whole.
func lateSourceRewritten(t *testing.T, p *Pool, absent []string) []byte {
	t.Helper()
	for _, path := range absent {
		if _, err := p.AddDisk(DiskConfig{Path: path}); err != nil {
			t.Fatal(err)
		}
	}
	a, err := p.Array("v")
	if err != nil {
		t.Fatalf("the source after its disks came back: %v", err)
	}
	vi := volumeInfo(t, p, "v")
	cut := readArray(t, a, int64(vi.Size))
	writeVolume(t, p, "v", randBytes(int(vi.Size)), 0)
	return cut
}

// reopenAll closes p and opens the pool again with every disk of its directory (that of
// one of its disks, path), copiers at full speed.
func reopenAll(t *testing.T, p *Pool, path string) *Pool {
	t.Helper()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	return openPool(t, Config{Disks: []DiskConfig{{Path: filepath.Join(filepath.Dir(path), "disk*.img")}}, RebuildRateMax: 64 << 20})
}
