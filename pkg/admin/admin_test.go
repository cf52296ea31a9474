package admin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// openPool opens a pool over n sparse file disks of 128 MiB in dir.
func openPool(t *testing.T, dir string, n int) *pool.Pool {
	t.Helper()
	var cfg pool.Config
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 128<<20); err != nil {
			t.Fatal(err)
		}
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: p})
	}
	p, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// serve serves p on an admin socket in dir until the test ends and returns a client.
func serve(t *testing.T, dir string, p *pool.Pool, vols VolumeOps) (*Client, *Server) {
	t.Helper()
	srv, err := Listen(Socket(dir), p, vols)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c, err := Dial(ctx, Socket(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, srv
}

// recordingOps is a VolumeOps that records its calls.
type recordingOps struct{ calls []string }

func (r *recordingOps) Created(name string) error {
	r.calls = append(r.calls, "created "+name)
	return nil
}
func (r *recordingOps) Deleting(name string) { r.calls = append(r.calls, "deleting "+name) }
func (r *recordingOps) Expanded(name string) error {
	r.calls = append(r.calls, "expanded "+name)
	return nil
}

// TestServer runs every request over a real pool through the socket, with and without
// VolumeOps, and checks that the pool's sentinels survive the trip.
func TestServer(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		withOps  bool
		wantVols error // of create, expand, delete
	}{
		{"StandaloneAgent", true, nil},
		{"Plugin", false, pool.ErrFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := openPool(t, dir, 4)
			defer p.Close()
			var ops *recordingOps
			var vols VolumeOps
			if tc.withOps {
				ops = &recordingOps{}
				vols = ops
			}
			c, _ := serve(t, dir, p, vols)
			fi, err := os.Stat(Socket(dir))
			if err != nil {
				t.Fatal(err)
			}
			if m := fi.Mode().Perm(); m != 0o600 {
				t.Errorf("socket mode %o, want 600", m)
			}
			s, err := c.Status(ctx)
			if err != nil || len(s.Disks) != 4 || s.Disks[0].Status != pool.StatusActive {
				t.Fatalf("status: %+v %v", s.Disks, err)
			}
			_, err = c.CreateVolume(ctx, CreateRequest{Name: "v1", Size: 32 << 20})
			if !errors.Is(err, tc.wantVols) {
				t.Fatalf("create: %v, want %v", err, tc.wantVols)
			}
			if !tc.withOps {
				// The plugin's volumes come from CSI; the pool itself is shared.
				if _, err := p.CreateVolume("v1", 32<<20, pool.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.ExpandVolume(ctx, "v1", 64<<20); !errors.Is(err, tc.wantVols) {
				t.Fatalf("expand: %v, want %v", err, tc.wantVols)
			}
			if _, err := c.CreateVolume(ctx, CreateRequest{Name: "v1", Size: 16 << 20}); err == nil {
				t.Fatal("create with another size succeeded")
			}
			for _, e := range []struct {
				op   string
				err  error
				want error
			}{
				{"fail unknown disk", c.FailDisk(ctx, "nope"), pool.ErrNotFound},
				{"fail disk1", c.FailDisk(ctx, filepath.Join(dir, "disk1.img")), nil},
			} {
				if !errors.Is(e.err, e.want) || (e.want == nil) != (e.err == nil) {
					t.Fatalf("%s: %v, want %v", e.op, e.err, e.want)
				}
			}
			if s, _ := c.Status(ctx); s.Volumes[0].Health != pool.Degraded {
				t.Fatalf("after fail: %s", s.Volumes[0].Health)
			}
			repl := filepath.Join(dir, "repl.img")
			_ = os.WriteFile(repl, nil, 0o600)
			_ = os.Truncate(repl, 128<<20)
			if _, err := c.AddDisk(ctx, pool.DiskConfig{Path: filepath.Join(dir, "missing.img")}); err == nil {
				t.Fatal("add of a missing path succeeded")
			}
			d, err := c.ReplaceDisk(ctx, filepath.Join(dir, "disk1.img"), pool.DiskConfig{Path: repl})
			if err != nil || d.Status != pool.StatusActive {
				t.Fatalf("replace: %+v %v", d, err)
			}
			if _, err := c.ReaddDisk(ctx, "nope"); !errors.Is(err, pool.ErrNotFound) {
				t.Fatalf("readd unknown: %v", err)
			}
			waitHealthy(t, c, "v1")
			if _, err := c.StartScrub(ctx, "v1", "verify"); !errors.Is(err, pool.ErrInvalidArgument) {
				t.Fatalf("scrub of a bad kind: %v", err)
			}
			if _, err := c.StartScrub(ctx, "nope", pool.ScrubCheck); !errors.Is(err, pool.ErrNotFound) {
				t.Fatalf("scrub of an unknown volume: %v", err)
			}
			if sc, err := c.StartScrub(ctx, "v1", pool.ScrubRepair); err != nil || sc.Kind != pool.ScrubRepair {
				t.Fatalf("scrub: %+v %v", sc, err)
			}
			if sc, err := c.StopScrub(ctx, "v1"); err != nil || sc.State == pool.ScrubRunning {
				t.Fatalf("stop scrub: %+v %v", sc, err)
			}
			if err := c.DeleteVolume(ctx, "v1"); !errors.Is(err, tc.wantVols) {
				t.Fatalf("delete: %v, want %v", err, tc.wantVols)
			}
			if tc.withOps {
				want := []string{"created v1", "expanded v1", "deleting v1"}
				if fmt.Sprint(ops.calls) != fmt.Sprint(want) {
					t.Errorf("VolumeOps calls %q", ops.calls)
				}
			}
		})
	}
}

func waitHealthy(t *testing.T, c *Client, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := c.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range s.Volumes {
			if v.Name == name && v.Health == pool.Healthy {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("volume %s not Healthy after a minute: %+v", name, s.Volumes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSuccessorKeepsItsSocket: a process that stops after a successor replaced the socket
// (a plugin restarted beside the old one) leaves the successor's socket in place; a process
// that stops alone removes its own.
func TestSuccessorKeepsItsSocket(t *testing.T) {
	dir := t.TempDir()
	p := openPool(t, dir, 2)
	defer p.Close()
	old, err := Listen(Socket(dir), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	next, err := Listen(Socket(dir), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- next.Serve(ctx) }()
	c, err := Dial(ctx, Socket(dir))
	if err != nil {
		t.Fatalf("the successor's socket after the old process stopped: %v", err)
	}
	_ = c.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(Socket(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}
