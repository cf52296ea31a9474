package kernel

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// helper is a child process running this test binary as one of TestMain's helpers.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	line  string // the first line it printed
	once  sync.Once
}

// startChild starts the helper mode (with env added), in a PID namespace of its own when
// newPIDNS, and reads its first line. The helper ends when its stdin closes (stop, or the
// test's cleanup).
func startChild(t *testing.T, mode string, newPIDNS bool, env ...string) *helper {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	cmd.Stderr = os.Stderr
	if newPIDNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the %s helper: %v", mode, err)
	}
	h := &helper{cmd: cmd, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		h.stop()
		t.Fatalf("the %s helper said %q: %v", mode, line, err)
	}
	h.line = strings.TrimSpace(line)
	t.Cleanup(h.stop)
	return h
}

// stop closes the helper's stdin and waits for it to exit.
func (h *helper) stop() {
	h.once.Do(func() {
		_ = h.stdin.Close()
		_ = h.cmd.Wait()
	})
}

// ownerHelper lists NBD_HELPER_VOLUME as being connected in the state at NBD_HELPER_STATE,
// prints "OWNER <its PID> <whether it runs in the host's PID namespace>" and lives until its
// stdin closes.
func ownerHelper() int {
	st, err := OpenState(os.Getenv("NBD_HELPER_STATE"))
	if err == nil {
		if _, err = st.connecting(os.Getenv("NBD_HELPER_VOLUME")); err == nil {
			fmt.Printf("OWNER %d %v\n", os.Getpid(), inHostPIDNS())
			_, _ = io.Copy(io.Discard, os.Stdin)
			return 0
		}
	}
	fmt.Fprintln(os.Stderr, "helper:", err)
	return 1
}

func scanOrFail(t *testing.T, dir string) *ownerScan {
	t.Helper()
	s, err := scanOwners(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.release)
	return s
}

// TestOwnerLiveness checks what Reclaim reads from the owner files: the volumes an owner is
// connecting have a live connector while its file is locked, by this process or by another in
// a PID namespace of its own (when run as root), a dead one when every owner that lists them
// died, and none listed once the connect is done. Dead owners' files are removed.
func TestOwnerLiveness(t *testing.T) {
	dir := t.TempDir()
	owners := filepath.Join(dir, OwnersDir)
	statePath := filepath.Join(dir, "state.json")
	st, err := OpenState(statePath)
	if err != nil {
		t.Fatal(err)
	}
	done, err := st.connecting("vol-self")
	if err != nil {
		t.Fatal(err)
	}
	// An owner that released its lock (died) while connecting vol-dead and vol-shared.
	gone, err := acquireOwner(owners)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"vol-dead", "vol-shared"} {
		if _, err := gone.begin(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := gone.release(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.connecting("vol-shared"); err != nil { // and this one lives
		t.Fatal(err)
	}
	newNS := os.Geteuid() == 0 // CLONE_NEWPID needs CAP_SYS_ADMIN
	peer := startChild(t, "owner", newNS, "NBD_HELPER_STATE="+statePath, "NBD_HELPER_VOLUME=vol-peer")
	var pid int
	var hostNS bool
	if _, err := fmt.Sscanf(peer.line, "OWNER %d %t", &pid, &hostNS); err != nil {
		t.Fatalf("owner helper said %q", peer.line)
	}
	if newNS && (pid != 1 || hostNS) {
		t.Fatalf("the owner helper has PID %d, host PID namespace %v; want 1 in a namespace of its own", pid, hostNS)
	}

	s := scanOrFail(t, owners)
	want := map[string]liveness{"vol-self": connectorAlive, "vol-peer": connectorAlive, "vol-shared": connectorAlive,
		"vol-dead": connectorDead, "vol-other": connectorUnlisted}
	for vol, w := range want {
		if got := s.of(vol); got != w {
			t.Errorf("%s: liveness %d, want %d", vol, got, w)
		}
	}
	s.removeDead()
	s.release()
	for _, name := range []string{gone.token, gone.token + connectingSuffix} {
		if _, err := os.Stat(filepath.Join(owners, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dead owner's %s is still there: %v", name, err)
		}
	}

	peer.stop()
	done()
	s = scanOrFail(t, owners)
	if got := s.of("vol-peer"); got != connectorDead {
		t.Errorf("vol-peer after its connector exited: liveness %d, want dead (%d)", got, connectorDead)
	}
	if got := s.of("vol-self"); got != connectorUnlisted {
		t.Errorf("vol-self after its connect was done: liveness %d, want unlisted (%d)", got, connectorUnlisted)
	}
	if got := s.of("vol-shared"); got != connectorAlive {
		t.Errorf("vol-shared, still being connected here: liveness %d, want alive", got)
	}
	s.removeDead()
	if _, err := os.Stat(filepath.Join(owners, st.owner.token)); err != nil {
		t.Errorf("this live process's owner file was removed: %v", err)
	}
}

// TestOwnerScanSeesOthersAlive: while one scan holds a dead owner's file (to remove it),
// another scan must not judge that owner anything but alive: two Reclaims never both act on
// one owner.
func TestOwnerScanSeesOthersAlive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), OwnersDir)
	o, err := acquireOwner(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.begin("vol-a"); err != nil {
		t.Fatal(err)
	}
	_ = o.release()
	first := scanOrFail(t, dir)
	second := scanOrFail(t, dir)
	if first.of("vol-a") != connectorDead || second.of("vol-a") != connectorAlive {
		t.Fatalf("liveness first %d, second %d; want dead then alive", first.of("vol-a"), second.of("vol-a"))
	}
}

// TestOwnerConnectingCounts: two connects of one volume in flight keep it listed until both
// are done; a done connect takes only its own off.
func TestOwnerConnectingCounts(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenState(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	d1, err := st.connecting("vol-a")
	if err != nil {
		t.Fatal(err)
	}
	d2, err := st.connecting("vol-a")
	if err != nil {
		t.Fatal(err)
	}
	d1()
	if got := scanOrFail(t, filepath.Join(dir, OwnersDir)).of("vol-a"); got != connectorAlive {
		t.Fatalf("vol-a with one connect left: liveness %d, want alive", got)
	}
	d2()
	if got := scanOrFail(t, filepath.Join(dir, OwnersDir)).of("vol-a"); got != connectorUnlisted {
		t.Fatalf("vol-a with no connect left: liveness %d, want unlisted", got)
	}
}

func TestOwnerNeedsStateDir(t *testing.T) {
	st, err := OpenState(filepath.Join(t.TempDir(), "missing", "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.connecting("vol-a"); err == nil {
		t.Fatal("connecting with a missing state directory succeeded: Reclaim could not see the connect")
	}
}
