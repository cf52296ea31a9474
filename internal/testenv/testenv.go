package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Kind says why a test was skipped. It is written in brackets at the start of the skip
// message, where hack/skipcheck reads it.
type Kind string

const (
	// KindMissing means something the test needs is absent on this machine. Under CI it is a
	// failure, never a skip (see Missing).
	KindMissing Kind = "missing"
	// KindGuest means the test is one half of a host/VM pair and runs on the other side: an
	// in-guest half on the host, or a host half inside the test VM.
	KindGuest Kind = "guest"
	// KindHeavy marks a slow test left out by -short or RAID10_SKIP_HEAVY (`make unit`).
	KindHeavy Kind = "heavy"
	// KindDriven means the test runs only when another test drives it with its environment
	// (e.g. the guest half of a benchmark); alone it has nothing to do.
	KindDriven Kind = "driven"
)

// HeavyEnv names the environment variable that, set non-empty, leaves out the heavy tests
// (as -short does); `make unit` sets it.
const HeavyEnv = "RAID10_SKIP_HEAVY"

// CI reports whether this process runs under CI: the environment variable CI set to
// anything but "", "0" or "false" (case-insensitive).
func CI() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv("CI"))) {
	case "", "0", "false":
		return false
	}
	return true
}

// Message is the text of a skip (or of a CI failure) of kind k: "[k] " and the reason.
func Message(k Kind, format string, args ...any) string {
	return "[" + string(k) + "] " + fmt.Sprintf(format, args...)
}

// Missing ends the test because something it needs is absent: it fails the test under CI
// (see CI) and skips it otherwise. The reason should name what is missing and how to get it.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := Message(KindMissing, format, args...)
	if CI() {
		t.Fatal(msg + " (under CI a missing requirement fails the test; hack/install-deps.sh installs it)")
	}
	t.Skip(msg)
}

// Skip skips the test by design, with kind k (KindGuest, KindHeavy or KindDriven). For a
// missing requirement use Missing: Skip with KindMissing behaves as Missing.
func Skip(t testing.TB, k Kind, format string, args ...any) {
	t.Helper()
	if k == KindMissing {
		Missing(t, format, args...)
		return
	}
	t.Skip(Message(k, format, args...))
}

// Heavy skips a slow test in -short mode and when RAID10_SKIP_HEAVY is set (`make unit`).
// what names the test's cost, e.g. "boots a VM".
func Heavy(t testing.TB, what string) {
	t.Helper()
	if testing.Short() || os.Getenv(HeavyEnv) != "" {
		Skip(t, KindHeavy, "%s; left out in -short mode and with %s", what, HeavyEnv)
	}
}

// Tool returns the path of the executable name (looked up in $PATH), or ends the test
// through Missing. hint says where it comes from, e.g. "Debian package libnbd-bin".
func Tool(t testing.TB, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not found (%s): %v", name, hint, err)
	}
	return p
}

// RequireTools ends the test through Missing, naming all of them at once, when any of the
// executables names is not in $PATH.
func RequireTools(t testing.TB, names ...string) {
	t.Helper()
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		Missing(t, "not found in $PATH: %s (run `make deps`)", strings.Join(missing, ", "))
	}
}

// RequireRoot ends the test through Missing when the process is not root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}
