package kernel

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// leakHelper connects a device for the volume named by NBD_HELPER_VOLUME and exits without
// recording it anywhere: a plugin that died between NBD_CMD_CONNECT and its state write.
func leakHelper() int {
	nl, err := Dial()
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	_, k, err := socketPair()
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	idx, err := nl.Connect(-1, Config{Size: 64 << 20, BlockSize: 4096, Timeout: 10 * time.Second,
		DeadConnTimeout: time.Minute, BackendID: BackendID(os.Getenv("NBD_HELPER_VOLUME")), Sockets: []*os.File{k}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	fmt.Printf("LEAKED %d\n", idx)
	return 0
}

func leak(t *testing.T, volume string) uint32 {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=leak", "NBD_HELPER_VOLUME="+volume)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("leak helper: %v", err)
	}
	var idx uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "LEAKED %d", &idx); err != nil {
		t.Fatalf("leak helper said %q", out)
	}
	return idx
}

// TestInKernelReclaim leaks devices as a process that died between CONNECT and its state
// write would, and checks Reclaim: a device of an unrecorded volume is recorded and then
// served again by Attach (on the same device: I/O works), a device of a volume recorded on
// another device is disconnected, and a device another live process connected, or one with
// a foreign backend, is left alone.
func TestInKernelReclaim(t *testing.T) {
	inGuest(t)
	dir := t.TempDir()
	nl, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	st, err := OpenState(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	leaked := leak(t, "vol-leaked")
	twin := leak(t, "vol-twin")
	foreign := leak(t, "") // backend "raid10-csi:" with no volume: not ours to judge
	if err := st.Put("vol-twin", Record{Index: 999, BackendID: BackendID("vol-twin")}); err != nil {
		t.Fatal(err)
	}
	// A device this (live) process connected and has not recorded yet: never touched.
	_, k, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	live, err := nl.Connect(-1, Config{Size: 64 << 20, BlockSize: 4096, BackendID: BackendID("vol-live"), Sockets: []*os.File{k}})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Disconnect(live)
	defer nl.Disconnect(foreign)

	got, err := Reclaim(nl, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "vol-leaked" {
		t.Fatalf("Reclaim recorded %v, want [vol-leaked]", got)
	}
	if rec, ok := st.Get("vol-leaked"); !ok || rec.Index != leaked {
		t.Fatalf("vol-leaked recorded as %+v %v, want nbd%d", rec, ok, leaked)
	}
	connected := func(idx uint32) bool {
		s, err := nl.Status(int(idx))
		return err == nil && len(s) == 1 && s[0].Connected
	}
	if connected(twin) {
		t.Errorf("nbd%d (vol-twin, recorded on another device) still connected", twin)
	}
	if !connected(live) || !connected(foreign) {
		t.Errorf("a device Reclaim must leave alone was disconnected: live %v, foreign %v", connected(live), connected(foreign))
	}
	if _, ok := st.Get("vol-live"); ok {
		t.Error("a live process's device was recorded")
	}

	fb, err := nbd.OpenFileBackend(filepath.Join(dir, "disk.img"), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	srv, err := nbd.NewServer(nbd.Options{}, nbd.Export{Name: "vol", Backend: fb})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	a := NewAttacher(srv, nl, st, Options{Connections: 1, Timeout: 10 * time.Second, DeadConnTimeout: time.Minute})
	d, err := a.Attach("vol-leaked", "vol")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Reattached || d.Index != leaked {
		t.Fatalf("Attach after Reclaim: %s reattached=%v, want nbd%d reattached", d.Path(), d.Reattached, leaked)
	}
	vm.FioVerify(t, verifyJob(d.Path(), "8M"))
	if err := a.Detach("vol-leaked"); err != nil {
		t.Fatal(err)
	}
}
