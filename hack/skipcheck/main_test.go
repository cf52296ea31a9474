package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

const module = "github.com/raid10-csi/raid10-csi"

// log is a `go test -v ./...` excerpt over three packages: chatty skips with their
// messages before the --- SKIP line, a parallel test's message after an "=== NAME", a
// subtest skip, a skip without a kind, and a package that failed.
const log = `=== RUN   TestKernelVM
--- PASS: TestKernelVM (61.20s)
=== RUN   TestInKernelAttach
    vm_test.go:45: [guest] runs in the VM (TestKernelVM)
--- SKIP: TestInKernelAttach (0.00s)
PASS
ok  	github.com/raid10-csi/raid10-csi/pkg/nbd/kernel	63.001s
=== RUN   TestSignatures
=== PAUSE TestSignatures
=== RUN   TestOther
=== CONT  TestSignatures
=== RUN   TestSignatures/btrfs
    signature_test.go:93: [heavy] slow; left out in -short mode and with RAID10_SKIP_HEAVY
=== NAME  TestOther
    other_test.go:10: unrelated log line
--- PASS: TestOther (0.10s)
=== RUN   TestSignatures/ext4
    --- SKIP: TestSignatures/btrfs (0.00s)
    --- PASS: TestSignatures/ext4 (0.20s)
--- PASS: TestSignatures (0.30s)
=== RUN   TestPlain
    plain_test.go:7: no tool
--- SKIP: TestPlain (0.00s)
FAIL
FAIL	github.com/raid10-csi/raid10-csi/pkg/pool	2.000s
--- SKIP: TestNonChatty (0.00s)
    x_test.go:3: [driven] run by BenchmarkX
ok  	github.com/raid10-csi/raid10-csi	0.1s
?   	github.com/raid10-csi/raid10-csi/pkg/apis	[no test files]
`

const allow = `# comment
pkg/nbd/kernel  TestInKernel\w*   guest   in-guest halves
pkg/pool        TestSignatures/.* heavy   allowed heavy subtests
pkg/pool        TestPlain         guest   the wrong kind: does not allow an untagged skip
`

func TestParseLog(t *testing.T) {
	got, err := ParseLog(strings.NewReader(log), module)
	if err != nil {
		t.Fatal(err)
	}
	want := []Skip{
		{"pkg/nbd/kernel", "TestInKernelAttach", "guest", "[guest] runs in the VM (TestKernelVM)"},
		{"pkg/pool", "TestSignatures/btrfs", "heavy", "[heavy] slow; left out in -short mode and with RAID10_SKIP_HEAVY"},
		{"pkg/pool", "TestPlain", "", "no tool"},
		{".", "TestNonChatty", "driven", "[driven] run by BenchmarkX"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseLog:\n got %q\nwant %q", got, want)
	}
}

// TestCheckUnlistedSkipFails: an allowed skip passes; a skip with no rule, one whose
// kind differs from its rule's, and one of another package are reported and fail.
func TestCheckUnlistedSkipFails(t *testing.T) {
	rules, err := ParseAllow(strings.NewReader(allow))
	if err != nil {
		t.Fatal(err)
	}
	skips, err := ParseLog(strings.NewReader(log), module)
	if err != nil {
		t.Fatal(err)
	}
	skips = append(skips, Skip{"pkg/driver", "TestInKernelAttach", "guest", "[guest] same name, other package"})
	var out bytes.Buffer
	bad := Check(&out, rules, skips)
	var names []string
	for _, s := range bad {
		names = append(names, s.Package+" "+s.Test)
	}
	if want := []string{"pkg/pool TestPlain", ". TestNonChatty", "pkg/driver TestInKernelAttach"}; !slices.Equal(names, want) {
		t.Fatalf("not allowed: %q, want %q\n%s", names, want, out.String())
	}
	for _, want := range []string{"5 skipped, 2 allowed by the allow-list, 3 not allowed", "UNEXPECTED SKIPS",
		"--- SKIP: TestPlain in pkg/pool: no tool (no [kind]: skipped without internal/testenv)",
		"allowed   1  pkg/nbd/kernel TestInKernel\\w* [guest]: in-guest halves"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseAllowRejects(t *testing.T) {
	for name, text := range map[string]string{
		"missing kind":  "pkg/x TestA missing a tool that is absent\n",
		"unknown kind":  "pkg/x TestA flaky sometimes\n",
		"no reason":     "pkg/x TestA guest\n",
		"bad regexp":    "pkg/x TestA( guest reason\n",
		"missing field": "pkg/x\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseAllow(strings.NewReader(text)); err == nil {
				t.Fatalf("ParseAllow(%q) accepted it", text)
			}
		})
	}
}

// TestRunExitStatus: with -fail an unlisted skip exits 1, without it 0 (report only).
func TestRunExitStatus(t *testing.T) {
	dir := t.TempDir()
	allowPath, logPath := filepath.Join(dir, "skips.txt"), filepath.Join(dir, "test.log")
	if err := os.WriteFile(allowPath, []byte(allow), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logPath, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if rc := run(allowPath, logPath, module, true, &out); rc != 1 || !strings.Contains(out.String(), "FAIL: 2 unexpected skips") {
		t.Errorf("run with -fail = %d, want 1:\n%s", rc, out.String())
	}
	if rc := run(allowPath, logPath, module, false, &out); rc != 0 {
		t.Errorf("run without -fail = %d, want 0", rc)
	}
	if rc := run(filepath.Join(dir, "absent"), logPath, module, false, &out); rc != 2 {
		t.Errorf("run with no allow-list = %d, want 2", rc)
	}
}

// TestAllowListMatchesTests: every line of hack/skips.txt names a package that exists and a
// pattern that matches one of its test functions, so the list cannot outlive the tests.
func TestAllowListMatchesTests(t *testing.T) {
	f, err := os.Open("../skips.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules, err := ParseAllow(f)
	if err != nil {
		t.Fatalf("hack/skips.txt: %v", err)
	}
	funcRe := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	for _, r := range rules {
		files, _ := filepath.Glob(filepath.Join("../..", r.Package, "*_test.go"))
		var tests []string
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range funcRe.FindAllStringSubmatch(string(b), -1) {
				tests = append(tests, m[1])
			}
		}
		if !slices.ContainsFunc(tests, r.Test.MatchString) {
			t.Errorf("hack/skips.txt:%d: no test in %s matches %q (tests: %v)", r.Line, r.Package, r.Pattern, tests)
		}
	}
}

// TestHackTestSh runs hack/test.sh itself on a fixture package whose test skips: under
// CI an unlisted skip fails the run and is printed; outside CI, or with no skip, it passes.
func TestHackTestSh(t *testing.T) {
	testenv.Heavy(t, "runs go test -race through hack/test.sh three times")
	testenv.RequireTools(t, "bash")
	for _, tc := range []struct {
		name, ci, fixture string
		wantRC            int
		want              string
	}{
		{"unlisted skip under CI", "true", "heavy", 1, "--- SKIP: TestMaybeSkips in hack/skipcheck/testdata/skipper: [heavy] fixture"},
		{"untagged skip under CI", "1", "plain", 1, "(no [kind]: skipped without internal/testenv)"},
		{"unlisted skip outside CI", "false", "heavy", 0, "1 skipped, 0 allowed by the allow-list, 1 not allowed"},
		{"no skip under CI", "true", "", 0, "0 skipped, 0 allowed by the allow-list, 0 not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("bash", "hack/test.sh", "./hack/skipcheck/testdata/skipper")
			cmd.Dir = "../.."
			cmd.Env = append(os.Environ(), "CI="+tc.ci, "SKIPCHECK_FIXTURE="+tc.fixture,
				"RAID10_TEST_LOG="+filepath.Join(t.TempDir(), "test.log"), "RAID10_CPU_LOG="+filepath.Join(t.TempDir(), "cpu.txt"))
			out, err := cmd.CombinedOutput()
			rc := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				rc = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if rc != tc.wantRC || !strings.Contains(string(out), tc.want) {
				t.Fatalf("hack/test.sh exit status %d (want %d); output lacks %q?\n%s", rc, tc.wantRC, tc.want, out)
			}
			// The CPU table (hack/cpu-exec.sh) names the package its test binary ran for.
			if !regexp.MustCompile(`(?m)^  hack/skipcheck/testdata/skipper +[0-9.]+ CPU s`).Match(out) {
				t.Errorf("output lacks the fixture package's line in the CPU table:\n%s", out)
			}
			if tc.wantRC != 0 && !strings.Contains(string(out), "UNEXPECTED SKIPS") {
				t.Errorf("output does not print the unexpected skips:\n%s", out)
			}
		})
	}
}
