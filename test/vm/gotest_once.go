package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// builtTests are the test binaries that RunGoTestOpts built in this process, by package
// and build flags: a package whose tests boot several VMs (pkg/driver, cmd/raid10-csi,
// pkg/ublk) links its test binary once, not once per VM (each link of such a binary took
// about 15 s of CPU on the 2-core CI machine; issue 24).
var builtTests struct {
	sync.Mutex
	m map[string]builtTest
}

type builtTest struct{ bin, dir string }

// pidPrefix starts the name of a directory that holds a binary kept for this process's
// life: gotest-pid<PID>-...; the next process's removeDeadPids removes it.
const pidPrefix = "gotest-pid"

// buildGoTestOnce is BuildGoTest for RunGoTestOpts: it builds pkg's test binary the first
// time this process asks for it with these flags and returns the same binary after that.
// The binary stays until the process ends (the returned cleanup does nothing).
func buildGoTestOnce(ctx context.Context, pkg string, flags ...string) (bin, dir string, cleanup func(), err error) {
	cwd, err := os.Getwd()
	if err != nil {
		return "", "", func() {}, err
	}
	key := strings.Join(append([]string{cwd, pkg}, flags...), "\x00")
	builtTests.Lock()
	defer builtTests.Unlock()
	if b, ok := builtTests.m[key]; ok {
		if _, err := os.Stat(b.bin); err == nil {
			return b.bin, b.dir, func() {}, nil
		}
	}
	bin, dir, cleanup, err = BuildGoTest(ctx, pkg, flags...)
	if err != nil || dir == "" { // failed, or a prebuilt binary given as pkg
		return bin, dir, cleanup, err
	}
	removeDeadPids(filepath.Dir(filepath.Dir(bin)))
	kept := filepath.Join(filepath.Dir(filepath.Dir(bin)),
		fmt.Sprintf("%s%d-%s", pidPrefix, os.Getpid(), strings.TrimPrefix(filepath.Base(filepath.Dir(bin)), "gotest-")))
	if err := os.Rename(filepath.Dir(bin), kept); err != nil {
		return bin, dir, cleanup, nil // still usable once, removed after the run
	}
	bin = filepath.Join(kept, filepath.Base(bin))
	if builtTests.m == nil {
		builtTests.m = map[string]builtTest{}
	}
	builtTests.m[key] = builtTest{bin: bin, dir: dir}
	return bin, dir, func() {}, nil
}

// removeDeadPids removes the kept binaries (pidPrefix directories in base) of processes
// that have ended.
func removeDeadPids(base string) {
	kept, _ := filepath.Glob(filepath.Join(base, pidPrefix+"*"))
	for _, p := range kept {
		pid, ok := keptPid(filepath.Base(p))
		if !ok || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(p)
		}
	}
}

// keptPid is the process ID in a pidPrefix directory name.
func keptPid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, pidPrefix)
	if !ok {
		return 0, false
	}
	digits, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(digits)
	return pid, err == nil && pid > 0
}
