package kernel

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestInKernelStaleRecord: after a node reboot the state file still records each volume's
// device of the previous boot, and the first volume attached may take a device another
// volume had. Attaching that other volume must leave the device alone and connect a new one
// (it failed with ErrNotOwner for ever: NodeStageVolume never succeeded after a reboot,
// found by test/cluster).
func TestInKernelStaleRecord(t *testing.T) {
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
	// vol-b holds a device, as the first volume attached after the reboot does.
	_, k, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	taken, err := nl.Connect(-1, Config{Size: 64 << 20, BlockSize: 4096, Timeout: 10 * time.Second, BackendID: BackendID("vol-b"), Sockets: []*os.File{k}})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Disconnect(taken)
	// vol-a's record from the previous boot names that device.
	if err := st.Put("vol-a", Record{Index: taken, BackendID: BackendID("vol-a"), Export: "vol"}); err != nil {
		t.Fatal(err)
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
	d, err := a.Attach("vol-a", "vol")
	if err != nil {
		t.Fatalf("Attach with a record naming another volume's device: %v", err)
	}
	if d.Index == taken || d.Reattached {
		t.Fatalf("Attach: %s reattached=%v; want a new device, not nbd%d", d.Path(), d.Reattached, taken)
	}
	if rec, ok := st.Get("vol-a"); !ok || rec.Index != d.Index {
		t.Fatalf("vol-a recorded as %+v %v, want %s", rec, ok, d.Path())
	}
	if id, err := BackendOf(taken); err != nil || id != BackendID("vol-b") {
		t.Fatalf("nbd%d now has backend %q (%v), want vol-b's", taken, id, err)
	}
	vm.FioVerify(t, verifyJob(d.Path(), "8M"))
	if err := a.Detach("vol-a"); err != nil {
		t.Fatal(err)
	}
}
