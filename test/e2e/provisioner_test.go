package e2e_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// The environment variables with the paths of the sidecar binaries (written by
// hack/build-tools.sh into the tool cache's env.sh).
const (
	provisionerEnv = "RAID10_CSI_PROVISIONER"
	resizerEnv     = "RAID10_CSI_RESIZER"
)

// sidecarBinary returns the binary named by the environment variable env. When it is unset
// or not executable it ends the test through testenv.Missing (fails under CI, skips otherwise).
func sidecarBinary(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	var missing error
	if p == "" {
		missing = fmt.Errorf("$%s is not set", env)
	} else if fi, err := os.Stat(p); err != nil {
		missing = err
	} else if fi.Mode()&0o111 == 0 {
		missing = fmt.Errorf("%s is not executable", p)
	}
	if missing == nil {
		return p
	}
	testenv.Missing(t, "e2e: CSI sidecar unavailable (%v); run `make deps` (hack/build-tools.sh) "+
		"and `source hack/tool-env.sh`, or use `make test`", missing)
	return ""
}

// sidecar is a CSI sidecar running as a subprocess in its own process group, its output in
// a log file.
type sidecar struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when it has exited and err is set
	err     error
}

// startSidecar starts bin with args and env (added to ours, with KUBECONFIG removed: the
// sidecars prefer it to --kubeconfig) and stops it in t.Cleanup: SIGTERM to its group, then
// SIGKILL after 10 s. When the test fails, the tail of its log is printed.
func startSidecar(t *testing.T, name, bin string, env []string, args ...string) *sidecar {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	for _, kv := range os.Environ() {
		if len(kv) < 11 || kv[:11] != "KUBECONFIG=" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	s := &sidecar{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		_ = f.Close()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
		}
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			_ = cmd.Process.Kill()
		}
		<-s.done
		if t.Failed() {
			t.Logf("last lines of %s (%s):\n%s", name, logPath, tail(logPath))
		}
	})
	t.Logf("%s started (pid %d), log %s", name, cmd.Process.Pid, logPath)
	return s
}

// exited says whether the sidecar has exited (it should not before the test ends), for the
// state that a failed wait prints.
func (s *sidecar) exited() string {
	select {
	case <-s.done:
		return fmt.Sprintf("; %s EXITED: %v", s.name, s.err)
	default:
		return ""
	}
}
