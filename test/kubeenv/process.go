package kubeenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// stopGrace is how long a process has to exit after SIGTERM before its group is killed.
const stopGrace = 10 * time.Second

// logTailBytes is how much of a process log is printed when a test fails.
const logTailBytes = 6 << 10

// process is one control-plane binary running in its own process group, its output in a
// log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited and err is set
	err     error         // the result of cmd.Wait
}

// startProcess starts bin with args, output (stdout and stderr) to dir/<name>.log, in a new
// process group that also gets SIGKILL if the test binary dies first.
func startProcess(name, dir, bin string, args ...string) (*process, error) {
	logPath := fmt.Sprintf("%s/%s.log", dir, name)
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("kubeenv: start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has already exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		if p.err == nil {
			return true, fmt.Errorf("kubeenv: %s exited", p.name)
		}
		return true, fmt.Errorf("kubeenv: %s exited: %w", p.name, p.err)
	default:
		return false, nil
	}
}

// stop ends the process group: SIGTERM, then SIGKILL after stopGrace. It waits for the
// process itself to be reaped.
func (p *process) stop() {
	if done, _ := p.exited(); done {
		// The leader is gone; children it left in the group (none expected) go too.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
	}
	// Whatever is left of the group, the leader included when it ignored SIGTERM.
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// logTail returns the last logTailBytes of the process log.
func (p *process) logTail() string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(fi.Size()-logTailBytes, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return err.Error()
	}
	if off > 0 {
		// Start at a line boundary.
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// logTails prints the tail of every process log.
func logTails(t testing.TB, procs []*process) {
	t.Helper()
	for _, p := range procs {
		t.Logf("kubeenv: last lines of %s (%s):\n%s", p.name, p.logPath, p.logTail())
	}
}
