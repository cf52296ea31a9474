package pool

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
)

var errCrash = errors.New("simulated crash")

// crashAt returns a failpoint function that fails at the named point once.
func crashAt(name string, hit *bool) func(string) error {
	return func(n string) error {
		if n == name && !*hit {
			*hit = true
			return errCrash
		}
		return nil
	}
}

// TestCrashAtEveryOrderingPoint stops create, delete and replace at each durability
// ordering point, restarts the pool from its disks and checks that the outcome is one the
// documented order promises, that Check passes and that a bystander volume's data is intact.
func TestCrashAtEveryOrderingPoint(t *testing.T) {
	type outcome int
	const (
		absent   outcome = iota // the volume does not exist, its space is free
		healthy                 // the volume exists and becomes Healthy by itself
		degraded                // the volume exists, Degraded, and a replace retried works
	)
	cases := []struct {
		op, point string
		want      outcome
	}{
		{"create", "create.engine", absent},
		{"create", "create.first-label", absent},
		{"create", "create.clear-flag-0", absent},
		{"create", "create.clear-flag-3", absent},
		{"delete", "delete.first-mark", absent},
		{"delete", "delete.marked", absent},
		{"delete", "delete.first-removed", absent},
		{"replace", "replace.engine", degraded},
		{"replace", "replace.target-label", healthy},
		{"replace", "replace.member-maps", healthy},
	}
	for _, c := range cases {
		t.Run(c.point, func(t *testing.T) {
			dir := t.TempDir()
			paths := makeDisks(t, dir, 4, 96<<20)
			cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}}
			p := openPool(t, cfg)
			if _, err := p.CreateVolume("keep", 16<<20, CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			keep := randBytes(1 << 20)
			writeVolume(t, p, "keep", keep, 2<<20)
			if c.op != "create" {
				if _, err := p.CreateVolume("v", 16<<20, CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			hit := false
			p.failpoint = crashAt(c.point, &hit)
			var err error
			switch c.op {
			case "create":
				_, err = p.CreateVolume("v", 16<<20, CreateOptions{})
			case "delete":
				err = p.DeleteVolume("v")
			case "replace":
				if err := p.FailDisk(paths[1]); err != nil {
					t.Fatal(err)
				}
				sparse(t, filepath.Join(dir, "disk4.img"), 96<<20)
				_, err = p.ReplaceDisk(paths[1], DiskConfig{Path: filepath.Join(dir, "disk4.img")})
			}
			if !hit || !errors.Is(err, errCrash) {
				t.Fatalf("failpoint %s not reached: %v", c.point, err)
			}
			p.failpoint = nil
			p.Close()

			p = openPool(t, cfg)
			defer p.Close()
			switch c.want {
			case absent:
				if _, err := p.Volume("v"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("volume v after the crash: %v", err)
				}
				want := 4 * p.extentLen(16<<20, 4, p.chunkSize())
				if c := p.Capacity(); c.Raw-c.FreeRaw != want {
					t.Fatalf("used %d bytes, want %d (only keep's extents)", c.Raw-c.FreeRaw, want)
				}
				if c.op == "create" { // the caller's retry succeeds
					if _, err := p.CreateVolume("v", 16<<20, CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			case healthy:
				waitHealth(t, p, "v", Healthy)
				waitHealth(t, p, "keep", Healthy)
			case degraded:
				waitHealth(t, p, "v", Degraded)
				if _, err := p.ReplaceDisk(paths[1], DiskConfig{Path: filepath.Join(dir, "disk4.img")}); err != nil {
					t.Fatal(err)
				}
				waitHealth(t, p, "v", Healthy)
				waitHealth(t, p, "keep", Healthy)
			}
			checkVolume(t, p, "keep", keep, 2<<20)
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestExpandCopyTargetCrash: ExpandVolume of a clone (a copy target: its array is 1 MiB
// longer than the volume, for the copy record) stopped after the engine grew the array and
// before the labels recorded the new size, with the old record's tail zeroed or not yet.
// After a restart the clone is its old size with its data; the retried expand succeeds (to
// the same size, or to a smaller one than the stopped expand asked for), the array's size
// is the new one, the old tail and the added range read zeroes, the data is intact and the
// copy is still recorded finished (Hydrated). All of it holds after another restart, a
// further expand works, and Check passes.
func TestExpandCopyTargetCrash(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		point            string
		stopped, retried uint64
	}{
		{"grow.engine", 32 * mib, 32 * mib},
		{"grow.zeroed", 32 * mib, 32 * mib},
		{"grow.engine", 48 * mib, 32 * mib},
	} {
		t.Run(fmt.Sprintf("%s/%dMiB-then-%dMiB", c.point, c.stopped/mib, c.retried/mib), func(t *testing.T) {
			dir := t.TempDir()
			makeDisks(t, dir, 2, 128*mib)
			cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}}
			p := openPool(t, cfg)
			defer func() { p.Close() }()
			data := hydratedClone(t, p)
			hit := false
			p.failpoint = crashAt(c.point, &hit)
			if _, err := p.ExpandVolume("c", c.stopped); !hit || !errors.Is(err, errCrash) {
				t.Fatalf("failpoint %s: %v", c.point, err)
			}
			p.failpoint = nil
			p.Close()
			p = openPool(t, cfg)
			if vi := volumeInfo(t, p, "c"); vi.Size != 16*mib || !vi.Hydrated || vi.Health != Healthy {
				t.Fatalf("clone after the crash: %+v", vi)
			}
			checkVolume(t, p, "c", data, 0)
			if vi, err := p.ExpandVolume("c", c.retried); err != nil || vi.Size != c.retried || !vi.Hydrated {
				t.Fatalf("expand retried after the crash: %+v, %v", vi, err)
			}
			checkGrownClone(t, p, data, c.retried)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			p = openPool(t, cfg)
			if vi := volumeInfo(t, p, "c"); vi.Size != c.retried || !vi.Hydrated || vi.Health != Healthy {
				t.Fatalf("clone after a restart: %+v", vi)
			}
			checkGrownClone(t, p, data, c.retried)
			if _, err := p.ExpandVolume("c", 48*mib); err != nil {
				t.Fatal(err)
			}
			checkGrownClone(t, p, data, 48*mib)
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkGrownClone checks clone "c" grown from 16 MiB to size: the array's size is size, the
// first 16 MiB hold data, the rest reads zeroes (the old copy record's tail included) and
// takes writes up to the end (zeroed again afterwards).
func checkGrownClone(t *testing.T, p *Pool, data []byte, size uint64) {
	t.Helper()
	a, err := p.Array("c")
	if err != nil {
		t.Fatal(err)
	}
	if a.Size() != int64(size) {
		t.Fatalf("clone's array: %d bytes, want %d", a.Size(), size)
	}
	checkVolume(t, p, "c", data, 0)
	checkVolume(t, p, "c", make([]byte, size-16<<20), 16<<20)
	end := randBytes(1 << 20)
	writeVolume(t, p, "c", end, int64(size)-1<<20)
	checkVolume(t, p, "c", end, int64(size)-1<<20)
	writeVolume(t, p, "c", make([]byte, 1<<20), int64(size)-1<<20)
}

// TestExpandCopyTargetPowerCut: ExpandVolume of a clone zeroes the old copy record's tail,
// which becomes volume space, and the labels then record the new size. A power cut right
// after the expand, with the disks' volatile write caches dropped, must not bring the
// record's bytes back as volume data: the zeroes are durable before the labels say the
// volume is larger (pool soak seed 1796207226166505630: "wrong data: c14 block 259: content
// no write made (first word 0x43303152)", the record's block magic "R10C").
func TestExpandCopyTargetPowerCut(t *testing.T) {
	const mib = 1 << 20
	wrapDiskBase = matrixWrap
	defer func() { wrapDiskBase = nil }()
	dir := t.TempDir()
	disks := makeDisks(t, dir, 2, 128*mib)
	cfg := Config{Disks: []DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}}
	p := openPool(t, cfg)
	defer func() { p.Close() }()
	data := hydratedClone(t, p)
	a, err := p.Array("c")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ExpandVolume("c", 32*mib); err != nil {
		t.Fatal(err)
	}
	// The power cut: every write the disks did not flush is lost.
	for _, path := range disks {
		d := dataPath(path)
		d.Disappear()
		d.Crash(nil)
	}
	_ = p.Close()
	p = openPool(t, cfg)
	if vi := volumeInfo(t, p, "c"); vi.Size != 32*mib || !vi.Hydrated {
		t.Fatalf("clone after the power cut: %+v, want 32 MiB and hydrated", vi)
	}
	checkGrownClone(t, p, data, 32*mib)
}

// hydratedClone makes volume "v" of 16 MiB, fills it, and makes "c", a clone of it, waiting
// until its copy has ended; it returns the data.
func hydratedClone(t *testing.T, p *Pool) []byte {
	t.Helper()
	const mib = 1 << 20
	if _, err := p.CreateVolume("v", 16*mib, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(16 * mib)
	writeVolume(t, p, "v", data, 0)
	if _, err := p.CreateVolume("c", 16*mib, CreateOptions{Source: &Source{Volume: "v"}}); err != nil {
		t.Fatal(err)
	}
	waitHydrated(t, p, "c")
	return data
}
