package pool

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/test/vm"
)

// hungChildEnv names the pool configuration of TestHungPredecessorInGuest's predecessor
// process (the test binary run again with it set).
const hungChildEnv = "RAID10_POOL_HUNG_CHILD"

// hungVolume is the size of TestHungPredecessorInGuest's volume.
const hungVolume = 16 << 20

// TestHungPredecessorInGuest: a predecessor process whose write is stuck in a hung disk
// (a suspended device-mapper device under a 1 ms delay target, so that the engine hands
// member calls to workers as on a real disk) fails that disk's member at the deadline,
// completes the write from the other copy, and closes its pool with the write still in the
// kernel. Its successor's Open must not take that disk while the write can still land: it
// is Refused as in use, never read or written, and the volume is served degraded with the
// predecessor's acknowledged data. The successor writes over the whole volume; then the
// device resumes, the stale write lands on the disk outside every array, the lock goes with
// it, and the disk comes back by itself, Failed as the predecessor recorded it; re-added, it
// resyncs: the volume reads the successor's data and a check finds no copy that differs. Issue 23, tenancy: "a successor must not open the
// disks while its predecessor still has member writes in flight inside a hung disk".
func TestHungPredecessorInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestBlockDevicesReadZeroesVM")
	if cfg := os.Getenv(hungChildEnv); cfg != "" {
		hungPredecessor(t, cfg)
		return
	}
	vm.RequireTools(t, "dmsetup")
	var rams []string
	for i := range 4 {
		rams = append(rams, fmt.Sprintf("/dev/ram%d", i))
	}
	devs := vm.NewDMDisks(t, "hung", rams, hungRAM)
	for _, d := range devs {
		vm.Sh(t, "dmsetup", "load", d.Name, "--table", d.Delayed(1))
		vm.Sh(t, "dmsetup", "resume", d.Name)
	}
	cfgPath := filepath.Join(t.TempDir(), "pool.json")
	var paths []string
	for _, d := range devs {
		paths = append(paths, fmt.Sprintf("%q", d.Path()))
	}
	cfgJSON := fmt.Sprintf(`{"disks": [%s], "memberTimeout": "1s"}`, strings.Join(
		func() []string {
			var out []string
			for _, p := range paths {
				out = append(out, `{"path": `+p+`}`)
			}
			return out
		}(), ", "))
	if err := os.WriteFile(cfgPath, []byte(cfgJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	p := openPool(t, cfg)
	if _, err := p.CreateVolume("v", hungVolume, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	writeVolume(t, p, "v", randBytes(hungVolume), 0)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// The predecessor: its write to disk 1 sticks there.
	child := startHungPredecessor(t, cfgPath)
	child.expect(t, "ready")
	hung := devs[1]
	vm.Sh(t, "dmsetup", "suspend", hung.Name)
	resumed := false
	resume := func() {
		if !resumed {
			vm.Sh(t, "dmsetup", "resume", hung.Name)
			resumed = true
		}
	}
	t.Cleanup(resume)
	child.say(t, "write")
	acked := child.expect(t, "written ")
	child.expect(t, "closed")
	predecessorData, err := os.ReadFile(strings.TrimPrefix(acked, "written "))
	if err != nil {
		t.Fatal(err)
	}

	// The successor.
	start := time.Now()
	p = openPool(t, cfg)
	defer p.Close()
	t.Logf("successor's Open with the predecessor's write stuck in %s: %v", hung.Path(), time.Since(start).Round(time.Millisecond))
	if st := diskStatus(t, p, hung.Path()); st.Status != StatusRefused || !strings.Contains(st.Reason, "in use") {
		t.Fatalf("disk %s with the predecessor's write in flight: %s (%s), want Refused as in use", hung.Path(), st.Status, st.Reason)
	}
	if vi := volumeInfo(t, p, "v"); vi.Health != Degraded {
		t.Fatalf("volume v without its hung disk: %s, want Degraded", vi.Health)
	}
	checkVolume(t, p, "v", predecessorData, 0)
	ours := randBytes(hungVolume)
	writeVolume(t, p, "v", ours, 0)

	// The hung disk answers: the stale write lands, outside every array, and the disk returns
	// as the predecessor left it, Failed (it passed the member deadline); the operator's
	// readd puts it back and it resyncs what its bitmap marks.
	resume()
	start = time.Now()
	deadline := start.Add(60 * time.Second)
	for diskStatus(t, p, hung.Path()).Status == StatusRefused {
		if time.Now().After(deadline) {
			st := diskStatus(t, p, hung.Path())
			t.Fatalf("disk %s answering again but not back after 60 s: %s (%s)", hung.Path(), st.Status, st.Reason)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st := diskStatus(t, p, hung.Path()); st.Status != StatusFailed {
		t.Fatalf("disk %s back as %s (%s), want Failed, as the predecessor recorded it", hung.Path(), st.Status, st.Reason)
	}
	t.Logf("disk %s back %v after it answered", hung.Path(), time.Since(start).Round(time.Millisecond))
	if _, err := p.ReaddDisk(hung.Path()); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, p, "v", Healthy)
	checkVolume(t, p, "v", ours, 0)
	a, err := p.Array("v")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := a.Check(context.Background()); err != nil || r.Mismatches != 0 || r.Lost != 0 {
		t.Fatalf("check after the hung disk's return: %+v, %v", r, err)
	}
	child.finish(t)
}

// hungRAM is the size of each brd ramdisk of TestBlockDevicesReadZeroesVM's boot.
const hungRAM = 64 << 20

// hungPredecessor is the predecessor process of TestHungPredecessorInGuest: it opens the
// pool, says "ready", and on "write" writes the whole volume and flushes (its writes to the
// suspended disk stick there until the member deadline fails that disk), saves what it
// wrote and says "written <file>", closes the pool, says "closed", and waits for its stdin
// to end.
func hungPredecessor(t *testing.T, cfgPath string) {
	cfg, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	p := openPool(t, cfg)
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if line, _ := in.ReadString('\n'); strings.TrimSpace(line) != "write" {
		t.Fatalf("predecessor: got %q, want write", line)
	}
	data := randBytes(hungVolume)
	writeVolume(t, p, "v", data, 0)
	saved := filepath.Join(filepath.Dir(cfgPath), "predecessor.data")
	if err := os.WriteFile(saved, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fmt.Println("written " + saved)
	if err := p.Close(); err != nil {
		t.Logf("predecessor's Close: %v", err)
	}
	fmt.Println("closed")
	_, _ = io.Copy(io.Discard, in)
}

// hungChild is the predecessor process, driven line by line.
type hungChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func startHungPredecessor(t *testing.T, cfgPath string) *hungChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHungPredecessorInGuest$", "-test.v")
	cmd.Env = append(os.Environ(), hungChildEnv+"="+cfgPath)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &hungChild{cmd: cmd, in: in, lines: make(chan string, 64)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

func (c *hungChild) say(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// expect waits up to a minute for a line of the predecessor starting with prefix (its other
// lines are logged) and returns it.
func (c *hungChild) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("predecessor ended before saying %q", prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
			t.Logf("predecessor: %s", line)
		case <-timeout:
			t.Fatalf("predecessor did not say %q within a minute", prefix)
		}
	}
}

// finish ends the predecessor's stdin and requires its test to pass.
func (c *hungChild) finish(t *testing.T) {
	t.Helper()
	_ = c.in.Close()
	passed := false
	for line := range c.lines {
		if strings.HasPrefix(line, "--- PASS") {
			passed = true
		}
		t.Logf("predecessor: %s", line)
	}
	if err := c.cmd.Wait(); err != nil || !passed {
		t.Fatalf("predecessor process: %v (passed: %v)", err, passed)
	}
}
