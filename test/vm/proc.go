package vm

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Proc is the test binary run again as a serving process that a test kills and starts
// again (the restart tests): its TestMain sees the helper variable in its environment
// and serves instead of running tests. The first line it prints begins with "READY ";
// its later lines arrive on Lines, its stderr goes to the test's.
type Proc struct {
	Cmd   *exec.Cmd
	Ready string      // the first line
	Lines chan string // the lines after it; closed when its stdout closes
}

// StartSelf starts this test binary with env added to the test's environment and waits
// up to timeout for its READY line; it fails t (after killing the process) when the
// process says anything else first, ends, or stays silent.
func StartSelf(t testing.TB, timeout time.Duration, env ...string) *Proc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{Cmd: cmd, Lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.Lines <- sc.Text()
		}
		close(p.Lines)
	}()
	select {
	case l, ok := <-p.Lines:
		if !ok || !strings.HasPrefix(l, "READY ") {
			p.Kill()
			t.Fatalf("helper said %q", l)
		}
		p.Ready = l
	case <-time.After(timeout):
		p.Kill()
		t.Fatalf("helper not ready after %s", timeout)
	}
	t.Logf("helper pid %d ready after %s: %s", cmd.Process.Pid, time.Since(start).Round(time.Millisecond), p.Ready)
	return p
}

// Kill ends the process with SIGKILL, as a crash would, and reaps it; a process already
// reaped is left alone.
func (p *Proc) Kill() {
	if p.Cmd.ProcessState != nil {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	_ = p.Cmd.Wait()
}

// Stop sends SIGTERM, the graceful stop, and returns the lines the process printed until
// it ended and how it ended.
func (p *Proc) Stop() ([]string, error) {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	var rest []string
	for l := range p.Lines {
		rest = append(rest, l)
	}
	return rest, p.Cmd.Wait()
}
