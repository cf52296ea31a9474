package vm

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// Sh runs a command in the guest (or on the host), logs it with its duration and
// returns its combined output; it fails t when the command fails.
func Sh(t testing.TB, name string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	t.Logf("%s %s (%s)", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RequireTools ends t through testenv.Missing (a skip on a developer's machine, a
// failure under CI) unless every tool is on PATH.
func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "vm: %s not found (hack/install-deps.sh installs it)", tool)
		}
	}
}

// LogDmesg logs the kernel log's lines that contain any of subs: the device's own
// messages and its I/O errors, next to the test's output.
func LogDmesg(t testing.TB, subs ...string) {
	t.Helper()
	out, _ := exec.Command("dmesg").Output()
	for _, l := range strings.Split(string(out), "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) {
				t.Log("dmesg: " + l)
				break
			}
		}
	}
}

// NoKernelWarning fails t (going on) for each WARNING in the kernel log: a driver that
// warns has seen a sequence it does not expect, even when the I/O succeeded.
func NoKernelWarning(t testing.TB) {
	t.Helper()
	out, _ := exec.Command("dmesg").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "WARNING:") {
			t.Errorf("kernel: %s", l)
		}
	}
}
