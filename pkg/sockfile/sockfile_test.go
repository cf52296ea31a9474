package sockfile

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSuccessorKeepsItsSocket: a successor that replaces the socket while its predecessor
// removes its own (between the predecessor's stat and its remove) keeps a reachable socket.
// Without the lock the predecessor's remove deletes the successor's file.
func TestSuccessorKeepsItsSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csi.sock")
	old, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.Close() }()
	type result struct {
		l   *Listener
		err error
	}
	done := make(chan result, 1)
	afterStat = func() {
		go func() {
			l, err := Listen(path)
			done <- result{l, err}
		}()
		time.Sleep(100 * time.Millisecond) // the successor's bind, were it not held off
	}
	defer func() { afterStat = nil }()
	if err := old.Remove(); err != nil {
		t.Fatal(err)
	}
	afterStat = nil
	r := <-done
	if r.err != nil {
		t.Fatalf("successor's Listen: %v", r.err)
	}
	defer func() { _ = r.l.Close() }()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("the successor's socket file is gone: %v", err)
	}
	if !os.SameFile(fi, r.l.own) {
		t.Fatal("the socket file is not the successor's")
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the successor: %v", err)
	}
	_ = c.Close()
	// The predecessor, stopping later still, leaves the successor's file alone.
	if err := old.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a second remove by the predecessor took the successor's file: %v", err)
	}
	if err := r.l.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the successor's own remove left %s: %v", path, err)
	}
}

// TestListenReplacesStale: a file left at the path (a crashed process's socket) is replaced.
func TestListenReplacesStale(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.sock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("%s after Listen: %v, %v", path, fi, err)
	}
}

// TestLockFileError names the lock file when the directory is missing.
func TestLockFileError(t *testing.T) {
	_, err := Listen(filepath.Join(t.TempDir(), "missing", "x.sock"))
	if err == nil {
		t.Fatal("Listen in a missing directory succeeded")
	}
	t.Log(err)
}
