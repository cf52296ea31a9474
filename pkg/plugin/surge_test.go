package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestSurgeSuccessorWaits plays a surge update's old pod against a real node plugin start
// (--mode=all over file disks): a predecessor serves the handover socket and holds the
// successor's request (kernel.HandoverRequest.Hold) as a serving plugin does. Meanwhile the
// successor reports itself healthy and Ready on its metrics address, has not opened a
// single disk (the predecessor's arrays are on them) and serves no CSI endpoint; once the
// predecessor is released (told to stop) and hands over, the successor opens the pool and
// serves. Stopped while it waits, it ends cleanly and the predecessor sees it go.
func TestSurgeSuccessorWaits(t *testing.T) {
	dir := t.TempDir()
	disks := vm.SparseFiles(t, dir, "disk", 4, 128<<20)
	cfg := map[string]any{"disks": []map[string]string{}}
	for _, d := range disks {
		cfg["disks"] = append(cfg["disks"].([]map[string]string), map[string]string{"path": d})
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "pool.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	hpath, err := handoverPath(state)
	if err != nil {
		t.Fatal(err)
	}
	// unlocked reports whether no process holds a lock on any disk (the pool flocks each
	// disk it opens).
	unlocked := func() error {
		for _, d := range disks {
			f, err := os.Open(d)
			if err != nil {
				return err
			}
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			f.Close() // releases the test's own lock
			if err != nil {
				return fmt.Errorf("%s is locked: %w", d, err)
			}
		}
		return nil
	}
	ready := func(addr string) (int, string) { return get("http://" + addr + "/readyz") }

	// start runs the successor and returns its address, CSI socket and Run's result.
	start := func(t *testing.T) (context.CancelFunc, string, string, chan error) {
		addr := freeAddr(t)
		sock := filepath.Join(dir, "csi.sock")
		o := Options{Mode: driver.ModeAll, NodeID: "n1", Endpoint: "unix://" + sock, ReadyTimeout: time.Second,
			PoolConfig: filepath.Join(dir, "pool.json"), StateDir: state, MetricsAddress: addr,
			Frontend: string(attach.FrontendNBD)}
		ctx, cancel := context.WithCancel(context.Background())
		done, ended := make(chan error, 1), make(chan struct{})
		go func() { done <- Run(ctx, &o); close(ended) }()
		t.Cleanup(func() {
			cancel()
			select {
			case <-ended:
			case <-time.After(30 * time.Second):
				t.Error("Run still runs 30 s after it was told to stop")
			}
		})
		return cancel, addr, sock, done
	}
	// standby accepts the successor's request, holds it and waits until the successor is
	// Ready on addr with no disk opened and no CSI socket.
	// Once released, it hands over nothing (no device is attached in this test).
	standby := func(t *testing.T, ln *kernel.HandoverListener, release chan struct{}, addr, sock string) chan error {
		held := make(chan error, 1)
		go func() {
			req, err := ln.Accept()
			if err == nil {
				if err = req.Hold(release); err == nil {
					err = req.Send(context.Background(), nil)
				}
			}
			held <- err
		}()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if code, _ := ready(addr); code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				code, body := ready(addr)
				t.Fatalf("the waiting successor's /readyz: %d %q after 30 s", code, body)
			}
		}
		if code, body := get("http://" + addr + "/healthz"); code != http.StatusOK {
			t.Fatalf("the waiting successor's /healthz: %d %q", code, body)
		}
		if err := unlocked(); err != nil {
			t.Fatalf("the waiting successor opened a disk of its predecessor: %v", err)
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the waiting successor serves a CSI socket (%v): calls would reach a plugin without its pool", err)
		}
		return held
	}

	t.Run("handed over when released", func(t *testing.T) {
		ln, err := kernel.ListenHandover(hpath)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		release := make(chan struct{})
		_, addr, sock, done := start(t)
		held := standby(t, ln, release, addr, sock)
		time.Sleep(500 * time.Millisecond)
		if err := unlocked(); err != nil {
			t.Fatalf("the waiting successor opened a disk of its predecessor: %v", err)
		}
		_ = ln.Close() // the predecessor hands over: no other successor may come
		close(release)
		if err := <-held; err != nil {
			t.Fatalf("Hold and Send: %v", err)
		}
		// Nothing is attached in this test: the predecessor's end is the empty list. What
		// follows is the successor's start proper, which needs the kernel's nbd (the VM).
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if unlocked() != nil {
				break // the successor opened the pool
			}
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "nbd") {
					t.Fatalf("the successor, released, ended with %v", err)
				}
				t.Logf("the successor opened the pool and stopped at the NBD attacher (no nbd on this machine): %v", err)
				return
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the released successor did not open the pool in 30 s")
			}
		}
	})

	t.Run("stopped while waiting", func(t *testing.T) {
		ln, err := kernel.ListenHandover(hpath)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cancel, addr, sock, done := start(t)
		held := standby(t, ln, make(chan struct{}), addr, sock)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run stopped while waiting: %v", err)
		}
		if err := <-held; !errors.Is(err, kernel.ErrSuccessorGone) {
			t.Fatalf("Hold = %v, want ErrSuccessorGone", err)
		}
		if code, _ := ready(addr); code != -1 {
			t.Fatalf("the stopped successor still answers on %s: %d", addr, code)
		}
	})
}
