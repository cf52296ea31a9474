package pool

import (
	"errors"
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
