package pool

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readRecords reads Config.DisksFile as a test sees it: path -> disk UUID.
func readRecords(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f disksFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, b)
	}
	if f.Version != disksFileVersion {
		t.Fatalf("%s: version %d", path, f.Version)
	}
	out := map[string]string{}
	for _, r := range f.Disks {
		out[r.Path] = r.Disk
	}
	return out
}

// TestDisksFileKeepsReplacement: a disk given by ReplaceDisk or AddDisk on a path the
// configuration does not list is recorded in DisksFile and found again at the next Open; a
// recorded disk replaced itself leaves the file. Without the file the same restart leaves
// the volume Degraded.
func TestDisksFileKeepsReplacement(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 6, testDiskSize)
	cfg := configFor(paths[:4]...)
	cfg.DisksFile = filepath.Join(dir, "state", DisksFileName) // the directory is created
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 96<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(4 << 20)
	writeVolume(t, p, "v", data, 1<<20)
	if _, err := os.Stat(cfg.DisksFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("disksFile written before any disk was given: %v", err)
	}

	if err := p.FailDisk(paths[1]); err != nil {
		t.Fatal(err)
	}
	di, err := p.ReplaceDisk(paths[1], DiskConfig{Path: paths[4]})
	if err != nil {
		t.Fatal(err)
	}
	if di.Reason != "" {
		t.Fatalf("replacement recorded, yet warned: %q", di.Reason)
	}
	spare, err := p.AddDisk(DiskConfig{Path: paths[5], Spare: true})
	if err != nil || spare.Status != StatusSpare {
		t.Fatalf("add spare: %+v %v", spare, err)
	}
	if got := readRecords(t, cfg.DisksFile); len(got) != 2 || got[paths[4]] != di.UUID || got[paths[5]] != spare.UUID {
		t.Fatalf("disksFile %v, want %s=%s and %s=%s", got, paths[4], di.UUID, paths[5], spare.UUID)
	}
	p.Close() // the rebuild may still run: it resumes

	p = openPool(t, cfg)
	if d := diskByPath(t, p, paths[4]); d.Status != StatusActive || d.UUID != di.UUID || d.Extents != 1 || d.Reason != "" {
		t.Fatalf("replacement after a restart: %+v", d)
	}
	if d := diskByPath(t, p, paths[5]); d.Status != StatusSpare {
		t.Fatalf("spare after a restart: %+v", d)
	}
	vi := waitHealth(t, p, "v", Healthy)
	onNew := false
	for _, m := range vi.Members {
		onNew = onNew || m.DiskPath == paths[4]
	}
	if !onNew {
		t.Fatalf("no member on the replacement %s: %+v", paths[4], vi.Members)
	}
	checkVolume(t, p, "v", data, 1<<20)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}

	// The recorded disk fails and the recorded spare takes over: the file keeps only the
	// spare, and the restart finds the volume whole on it.
	if err := p.FailDisk(paths[4]); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	if got := readRecords(t, cfg.DisksFile); len(got) != 1 || got[paths[5]] != spare.UUID {
		t.Fatalf("disksFile after the recorded disk was replaced: %v", got)
	}
	p.Close()
	p = openPool(t, cfg)
	waitHealth(t, p, "v", Healthy)
	checkVolume(t, p, "v", data, 1<<20)
	p.Close()

	// Control: the same restart without the file misses the spare's member.
	nofile := cfg
	nofile.DisksFile = ""
	p = openPool(t, nofile)
	defer p.Close()
	waitHealth(t, p, "v", Degraded)
}

// TestDisksFileReturnedDisk: a missing disk of the pool offered back on a new path is
// recorded under that path.
func TestDisksFileReturnedDisk(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 4, testDiskSize)
	cfg := configFor(paths...)
	cfg.DisksFile = filepath.Join(dir, DisksFileName)
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", 64<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(1 << 20)
	writeVolume(t, p, "v", data, 0)
	p.Close()

	moved := filepath.Join(dir, "moved.img")
	if err := os.Rename(paths[2], moved); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, cfg)
	waitHealth(t, p, "v", Degraded)
	di, err := p.AddDisk(DiskConfig{Path: moved})
	if err != nil || di.Status != StatusActive || di.Reason != "" {
		t.Fatalf("returning disk: %+v %v", di, err)
	}
	waitHealth(t, p, "v", Healthy)
	p.Close()
	if got := readRecords(t, cfg.DisksFile); len(got) != 1 || got[moved] != di.UUID {
		t.Fatalf("disksFile %v, want %s=%s", got, moved, di.UUID)
	}
	p = openPool(t, cfg)
	defer p.Close()
	waitHealth(t, p, "v", Healthy)
	checkVolume(t, p, "v", data, 0)
}

// TestDisksFileNeverClaims: a recorded path whose disk carries no label (a crash between the
// record and the claim, a disk swapped under the path) is refused, untouched, with the file
// named; a file that cannot be read is an error naming it, not an empty list.
func TestDisksFileNeverClaims(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 3, testDiskSize)
	cfg := configFor(paths[:2]...)
	cfg.DisksFile = filepath.Join(dir, DisksFileName)
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(cfg.DisksFile, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"version": 1, "disks": [{"path": "` + paths[2] + `", "disk": "` + NewUUID().String() + `"}]}`)
	p := openPool(t, cfg)
	d := diskByPath(t, p, paths[2])
	if d.Status != StatusRefused || !strings.Contains(d.Reason, cfg.DisksFile) {
		t.Fatalf("blank recorded disk: %+v", d)
	}
	p.Close()
	f, err := openDiskFile(paths[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := readLabel(f.f).err(); !errors.Is(err, errNoLabel) {
		t.Fatalf("blank recorded disk was written to: %v", err)
	}
	_ = f.close()

	for _, bad := range []string{
		`{"version": 1, "disks": [`,
		`{"version": 2, "disks": []}`,
		`{"version": 1, "disks": [{"path": "` + dir + `/disk*.img", "disk": "` + NewUUID().String() + `"}]}`,
		`{"version": 1, "disks": [{"path": "` + paths[2] + `", "disk": "x"}]}`,
	} {
		write(bad)
		_, err := Open(cfg)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), cfg.DisksFile) {
			t.Fatalf("disksFile %s: %v", bad, err)
		}
	}
}
