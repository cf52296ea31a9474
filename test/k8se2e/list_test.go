package k8se2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// e2eDirEnv names the directory hack/build-k8s-e2e.sh printed (e2e.test, agnhost); the
// Makefile's k8s-e2e targets set it.
const e2eDirEnv = "RAID10_K8S_E2E_DIR"

// e2eBinary returns the cached e2e.test, or skips: this module's tests run only when asked
// for (make k8s-e2e, make k8s-e2e-check), after the binary is built.
func e2eBinary(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(e2eDirEnv)
	if dir == "" {
		t.Skipf("%s not set: run `make k8s-e2e CHECK=1` (it builds e2e.test with hack/build-k8s-e2e.sh)", e2eDirEnv)
	}
	bin := filepath.Join(dir, "e2e.test")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s=%s: %v (hack/build-k8s-e2e.sh builds it)", e2eDirEnv, dir, err)
	}
	return bin
}

// listSpecs runs e2e.test --list-tests for the driver file and returns the spec names.
func listSpecs(t *testing.T, bin, driverFile string) []string {
	t.Helper()
	cmd := exec.Command(bin, "--list-tests", "--storage.testdriver="+driverFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --list-tests: %v\n%s", bin, err, out)
	}
	var specs []string
	for _, line := range strings.Split(string(out), "\n") {
		// "    FILE:LINE: External Storage [Driver: raid10.csi.io] [Testpattern: ...] suite spec"
		if _, name, ok := strings.Cut(line, ": External Storage [Driver: "); ok {
			specs = append(specs, "External Storage [Driver: "+name)
		}
	}
	if len(specs) == 0 {
		t.Fatalf("%s --list-tests listed no spec of the driver:\n%s", bin, out)
	}
	return specs
}

// wantSpecs are what driver.yaml's capabilities must select: each is a regular expression
// that at least one listed spec must match, named by the capability or suite it proves.
var wantSpecs = []struct{ why, re string }{
	{"provisioning", `\[Testpattern: Dynamic PV \(default fs\)\] provisioning should provision storage with mount options`},
	{"snapshotDataSource", `provisioning should provision storage with snapshot data source`},
	{"pvcDataSource", `provisioning should provision storage with pvc data source$`},
	{"block", `\[Testpattern: Dynamic PV \(block volmode\)\] volumeMode should not mount / map unused volumes in a pod`},
	{"ext4", `\[Testpattern: Dynamic PV \(ext4\)\] volumes should store data`},
	{"xfs", `\[Testpattern: Dynamic PV \(xfs\)\]`},
	{"exec", `volumes should allow exec of files on the volume`},
	{"persistence", `\[Testpattern: Dynamic PV \(default fs\)\] volumes should store data`},
	{"onlineExpansion", `volume-expand should resize volume when PVC is edited while pod is using it`},
	{"offlineExpansion", `volume-expand should resize volume when PVC is edited and the pod is re-created on the same node after controller resize is finished`},
	{"snapshottable", `\[Testpattern: Dynamic Snapshot \(delete policy\)\] snapshottable`},
	{"readWriteOncePod", `read-write-once-pod`},
	{"fsGroup", `fsgroupchangepolicy`},
	{"capacity", `capacity provides storage capacity information`},
	{"topology", `topology should provision a volume and schedule a pod with AllowedTopologies`},
	{"multipods", `multiVolume .*should concurrently access the single volume from pods on the same node`},
	{"volumeLimits", `volumeLimits should verify that all csinodes have volume limits`},
	{"volumeIO", `volumeIO should write files of various sizes, verify size, validate content`},
	{"subPath", `subPath should support existing directory`},
	{"ephemeral", `\[Testpattern: Generic Ephemeral-volume \(default fs\)`},
}

// noSpecs must match no listed spec: what the driver does not do.
var noSpecs = []struct{ why, re string }{
	{"no inline CSI volumes", `\[Testpattern: CSI Ephemeral-volume`},
	{"no pre-provisioned PVs", `\[Testpattern: Pre-provisioned PV`},
	{"no group snapshots", `volumegroupsnapshottable`},
}

// missing returns the wantSpecs entries no spec matches.
func missing(specs []string) []string {
	var out []string
	for _, w := range wantSpecs {
		re := regexp.MustCompile(w.re)
		found := false
		for _, s := range specs {
			if re.MatchString(s) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, w.why+" ("+w.re+")")
		}
	}
	return out
}

// TestDriverYAMLSelectsSuites checks, with the binary's own --list-tests, that driver.yaml
// selects the specs of every capability it declares and none of what the driver lacks: the
// framework ignores a key it does not know, and a false capability drops its specs at
// registration, so a misspelled key shows only here. The misspelled subtest proves the check
// fails when a capability's key is wrong.
func TestDriverYAMLSelectsSuites(t *testing.T) {
	bin := e2eBinary(t)
	specs := listSpecs(t, bin, "driver.yaml")
	t.Logf("%d specs listed for driver.yaml", len(specs))
	suites := map[string]int{}
	suiteRe := regexp.MustCompile(`\[Testpattern: [^]]*\] (\S+)`)
	for _, s := range specs {
		if m := suiteRe.FindStringSubmatch(s); m != nil {
			suites[m[1]]++
		}
	}
	t.Logf("specs per suite: %v", suites)
	for _, m := range missing(specs) {
		t.Errorf("no spec for %s: a capability in driver.yaml is off or misspelled", m)
	}
	for _, n := range noSpecs {
		re := regexp.MustCompile(n.re)
		for _, s := range specs {
			if re.MatchString(s) {
				t.Errorf("%s, but driver.yaml selects %q", n.why, s)
				break
			}
		}
	}

	t.Run("misspelled", func(t *testing.T) {
		b, err := os.ReadFile("driver.yaml")
		if err != nil {
			t.Fatal(err)
		}
		bad := strings.Replace(string(b), "    block: true", "    blocks: true", 1)
		if bad == string(b) {
			t.Fatal("driver.yaml has no '    block: true' line to misspell")
		}
		f := filepath.Join(t.TempDir(), "driver.yaml")
		if err := os.WriteFile(f, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		got := missing(listSpecs(t, bin, f))
		if len(got) != 1 || !strings.HasPrefix(got[0], "block ") {
			t.Errorf("with block misspelled, missing = %v, want only block", got)
		}
	})
}
