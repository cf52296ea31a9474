package kernel

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// leakHelper connects a device for the volume named by NBD_HELPER_VOLUME and does not record
// it anywhere: a plugin between NBD_CMD_CONNECT and its state write. With NBD_HELPER_STATE it
// lists the volume in its owner file there first, as Attach does; without, it is a version
// before owner files. It prints "LEAKED <index> <owner token or -> <its PID>", then exits (a
// plugin that died there), or with NBD_HELPER_HOLD=1 lives on until its stdin closes.
func leakHelper() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "helper:", err); return 1 }
	nl, err := Dial()
	if err != nil {
		return fail(err)
	}
	vol, tok := os.Getenv("NBD_HELPER_VOLUME"), "-"
	if path := os.Getenv("NBD_HELPER_STATE"); path != "" {
		st, err := OpenState(path)
		if err != nil {
			return fail(err)
		}
		if _, err := st.connecting(vol); err != nil {
			return fail(err)
		}
		tok = st.owner.token
	}
	_, k, err := socketPair()
	if err != nil {
		return fail(err)
	}
	idx, err := nl.Connect(-1, Config{Size: 64 << 20, BlockSize: 4096, Timeout: 10 * time.Second,
		DeadConnTimeout: time.Minute, BackendID: BackendID(vol), Sockets: []*os.File{k}})
	if err != nil {
		return fail(err)
	}
	fmt.Printf("LEAKED %d %s %d\n", idx, tok, os.Getpid())
	if os.Getenv("NBD_HELPER_HOLD") == "1" {
		_, _ = io.Copy(io.Discard, os.Stdin)
	}
	return 0
}

// reclaimHelper runs Reclaim on the state at NBD_HELPER_STATE and prints "RECLAIMED <its PID>
// <volumes, comma-separated>".
func reclaimHelper() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "helper:", err); return 1 }
	nl, err := Dial()
	if err != nil {
		return fail(err)
	}
	st, err := OpenState(os.Getenv("NBD_HELPER_STATE"))
	if err != nil {
		return fail(err)
	}
	vols, err := Reclaim(nl, st)
	if err != nil {
		return fail(err)
	}
	slices.Sort(vols)
	fmt.Printf("RECLAIMED %d %s\n", os.Getpid(), strings.Join(vols, ","))
	return 0
}

type leaked struct {
	idx   uint32
	token string
	h     *helper
}

// leak runs leakHelper; state "" is a connector of a version before owner files; hold keeps
// the helper alive in a PID namespace of its own until h.stop.
func leak(t *testing.T, volume, state string, hold bool) leaked {
	t.Helper()
	env := []string{"NBD_HELPER_VOLUME=" + volume, "NBD_HELPER_STATE=" + state}
	if hold {
		env = append(env, "NBD_HELPER_HOLD=1")
	}
	h := startChild(t, "leak", hold, env...)
	var l leaked
	var pid int
	if _, err := fmt.Sscanf(h.line, "LEAKED %d %s %d", &l.idx, &l.token, &pid); err != nil {
		t.Fatalf("leak helper said %q", h.line)
	}
	if hold && pid != 1 {
		t.Fatalf("the holding leak helper has PID %d, want 1 (a PID namespace of its own)", pid)
	}
	if !hold {
		h.stop() // dead before anyone looks
	}
	l.h = h
	return l
}

// reclaimElsewhere runs Reclaim in a process in a PID namespace of its own, as a node plugin
// pod without hostPID does, and returns the volumes it recorded.
func reclaimElsewhere(t *testing.T, state string) []string {
	t.Helper()
	h := startChild(t, "reclaim", true, "NBD_HELPER_STATE="+state)
	h.stop()
	var pid int
	var vols string
	if n, _ := fmt.Sscanf(h.line, "RECLAIMED %d %s", &pid, &vols); n < 1 || pid != 1 {
		t.Fatalf("reclaim helper said %q; want RECLAIMED from PID 1 of its own namespace", h.line)
	}
	if vols == "" {
		return nil
	}
	return strings.Split(vols, ",")
}

// TestInKernelReclaim leaks devices as processes that died between CONNECT and their state
// write would, or that still live there, and runs Reclaim in a PID namespace of its own, as a
// node plugin pod without hostPID does: a device of an unrecorded volume whose connector died
// is recorded and then served again by Attach (on the same device: I/O works); one of a
// volume recorded on another device is disconnected; one whose connector lives (this process;
// a process in a third PID namespace), one with a foreign backend, and one that no owner file
// lists (a version before them) are left alone. When the namespaced connector dies, the next
// Reclaim takes its device; a Reclaim in the host's PID namespace takes the unlisted one by
// its PID. Dead owners' files are removed.
func TestInKernelReclaim(t *testing.T) {
	inGuest(t)
	if !inHostPIDNS() {
		t.Fatal("the guest test does not run in the host's PID namespace")
	}
	dir := t.TempDir()
	nl, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	statePath := filepath.Join(dir, "state.json")
	st, err := OpenState(statePath)
	if err != nil {
		t.Fatal(err)
	}
	dead := leak(t, "vol-leaked", statePath, false)
	unlisted := leak(t, "vol-unlisted", "", false)
	twin := leak(t, "vol-twin", statePath, false)
	foreign := leak(t, "", "", false) // backend "raid10-csi:" with no volume: not ours to judge
	peer := leak(t, "vol-peer", statePath, true)
	if err := st.Put("vol-twin", Record{Index: 999, BackendID: BackendID("vol-twin")}); err != nil {
		t.Fatal(err)
	}
	// A device this (live) process is connecting and has not recorded yet: never touched.
	done, err := st.connecting("vol-live")
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	_, k, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	live, err := nl.Connect(-1, Config{Size: 64 << 20, BlockSize: 4096, BackendID: BackendID("vol-live"), Sockets: []*os.File{k}})
	if err != nil {
		t.Fatal(err)
	}
	for _, idx := range []uint32{live, foreign.idx, peer.idx, unlisted.idx} {
		defer nl.Disconnect(idx)
	}

	if got := reclaimElsewhere(t, statePath); !slices.Equal(got, []string{"vol-leaked"}) {
		t.Fatalf("Reclaim in a PID namespace of its own recorded %v, want [vol-leaked]", got)
	}
	if st, err = OpenState(statePath); err != nil { // what the other process wrote
		t.Fatal(err)
	}
	if rec, ok := st.Get("vol-leaked"); !ok || rec.Index != dead.idx {
		t.Errorf("vol-leaked recorded as %+v %v, want nbd%d", rec, ok, dead.idx)
	}
	connected := func(idx uint32) bool {
		s, err := nl.Status(int(idx))
		return err == nil && len(s) == 1 && s[0].Connected
	}
	if connected(twin.idx) {
		t.Errorf("nbd%d (vol-twin, recorded on another device) still connected", twin.idx)
	}
	for name, idx := range map[string]uint32{"this process's": live, "the namespaced live process's": peer.idx,
		"the foreign": foreign.idx, "the unlisted": unlisted.idx} {
		if !connected(idx) {
			t.Errorf("%s device nbd%d was disconnected", name, idx)
		}
	}
	for _, vol := range []string{"vol-live", "vol-peer", "vol-unlisted"} {
		if _, ok := st.Get(vol); ok {
			t.Errorf("%s, whose connector lives or cannot be told, was recorded", vol)
		}
	}
	ownerFiles := func() []string {
		ents, _ := os.ReadDir(filepath.Join(dir, OwnersDir))
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	for _, tok := range []string{dead.token, twin.token} {
		if slices.ContainsFunc(ownerFiles(), func(n string) bool { return strings.HasPrefix(n, tok) }) {
			t.Errorf("a dead owner's files are still there: %v", ownerFiles())
		}
	}

	// The namespaced connector dies: its device is leaked now, and taken.
	peer.h.stop()
	if got := reclaimElsewhere(t, statePath); !slices.Equal(got, []string{"vol-peer"}) {
		t.Fatalf("Reclaim after the namespaced connector died recorded %v, want [vol-peer]", got)
	}
	// In the host's PID namespace the unlisted device's PID tells: its connector is dead.
	if st, err = OpenState(statePath); err != nil {
		t.Fatal(err)
	}
	if got, err := Reclaim(nl, st); err != nil || !slices.Equal(got, []string{"vol-unlisted"}) {
		t.Fatalf("Reclaim in the host's PID namespace recorded %v (%v), want [vol-unlisted]", got, err)
	}
	if got := ownerFiles(); len(got) != 2 { // this process's owner file and its connecting file
		t.Errorf("owner files left: %v, want only this process's two", got)
	}
	attachAfterReclaim(t, nl, st, dir, "vol-leaked", dead.idx)
}

// attachAfterReclaim attaches a reclaimed volume: its device must be reattached and serve I/O.
func attachAfterReclaim(t *testing.T, nl *Netlink, st *State, dir, vol string, idx uint32) {
	t.Helper()
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
	d, err := a.Attach(vol, "vol")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Reattached || d.Index != idx {
		t.Fatalf("Attach after Reclaim: %s reattached=%v, want nbd%d reattached", d.Path(), d.Reattached, idx)
	}
	vm.FioVerify(t, verifyJob(d.Path(), "8M"))
	if err := a.Detach(vol); err != nil {
		t.Fatal(err)
	}
}
