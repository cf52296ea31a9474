package testenv

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB whose Fatal and Skip record what they were told and end the
// helper call (as the real ones end the test) by panicking with ended.
type recorder struct {
	testing.TB
	failed, skipped string
}

type ended struct{}

func (r *recorder) Helper()                      {}
func (r *recorder) Fatal(args ...any)            { r.failed = fmt.Sprint(args...); panic(ended{}) }
func (r *recorder) Fatalf(f string, args ...any) { r.Fatal(fmt.Sprintf(f, args...)) }
func (r *recorder) Skip(args ...any)             { r.skipped = fmt.Sprint(args...); panic(ended{}) }
func (r *recorder) Skipf(f string, args ...any)  { r.Skip(fmt.Sprintf(f, args...)) }

// run calls f with r and returns r once f returned or ended through Fatal or Skip.
func (r *recorder) run(f func(testing.TB)) *recorder {
	func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(ended); !ok {
					panic(v)
				}
			}
		}()
		f(r)
	}()
	return r
}

func TestCI(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  bool
	}{
		{"", false}, {"0", false}, {"false", false}, {"FALSE", false}, {" false ", false},
		{"true", true}, {"1", true}, {"yes", true}, {"True", true},
	} {
		t.Run(fmt.Sprintf("%q", tc.value), func(t *testing.T) {
			t.Setenv("CI", tc.value)
			if got := CI(); got != tc.want {
				t.Errorf("CI() with CI=%q = %v, want %v", tc.value, got, tc.want)
			}
		})
	}
}

// TestMissingFailsUnderCI: every way to report a missing requirement fails under CI and
// skips (with the [missing] tag) elsewhere; the by-design kinds skip in both.
func TestMissingFailsUnderCI(t *testing.T) {
	const absent = "raid10-csi-no-such-tool"
	calls := []struct {
		name string
		f    func(testing.TB)
		kind Kind
	}{
		{"Missing", func(t testing.TB) { Missing(t, "thing %d", 1) }, KindMissing},
		{"Tool", func(t testing.TB) { Tool(t, absent, "nowhere") }, KindMissing},
		{"RequireTools", func(t testing.TB) { RequireTools(t, "sh", absent) }, KindMissing},
		{"Skip missing", func(t testing.TB) { Skip(t, KindMissing, "x") }, KindMissing},
		{"Skip guest", func(t testing.TB) { Skip(t, KindGuest, "runs in the VM (TestX)") }, KindGuest},
		{"Skip driven", func(t testing.TB) { Skip(t, KindDriven, "run by BenchmarkX") }, KindDriven},
	}
	for _, ci := range []string{"true", ""} {
		for _, c := range calls {
			t.Run(c.name+"/CI="+ci, func(t *testing.T) {
				t.Setenv("CI", ci)
				r := (&recorder{TB: t}).run(c.f)
				prefix := "[" + string(c.kind) + "] "
				if c.kind == KindMissing && ci != "" {
					if r.failed == "" || r.skipped != "" || !strings.HasPrefix(r.failed, prefix) {
						t.Fatalf("under CI: failed %q, skipped %q; want a failure starting with %q", r.failed, r.skipped, prefix)
					}
					return
				}
				if r.skipped == "" || r.failed != "" || !strings.HasPrefix(r.skipped, prefix) {
					t.Fatalf("failed %q, skipped %q; want a skip starting with %q", r.failed, r.skipped, prefix)
				}
			})
		}
	}
}

func TestFoundToolPasses(t *testing.T) {
	t.Setenv("CI", "true")
	r := (&recorder{TB: t}).run(func(tb testing.TB) {
		if p := Tool(tb, "sh", "base system"); !strings.HasSuffix(p, "/sh") {
			tb.Fatalf("Tool(sh) = %q", p)
		}
		RequireTools(tb, "sh", "true")
	})
	if r.failed != "" || r.skipped != "" {
		t.Fatalf("present tools: failed %q, skipped %q", r.failed, r.skipped)
	}
}

func TestHeavy(t *testing.T) {
	t.Setenv("CI", "true")
	t.Setenv(HeavyEnv, "")
	if testing.Short() {
		Skip(t, KindHeavy, "this check needs a run without -short")
	}
	if r := (&recorder{TB: t}).run(func(tb testing.TB) { Heavy(tb, "slow") }); r.skipped != "" || r.failed != "" {
		t.Fatalf("Heavy without -short or %s: skipped %q, failed %q", HeavyEnv, r.skipped, r.failed)
	}
	t.Setenv(HeavyEnv, "1")
	r := (&recorder{TB: t}).run(func(tb testing.TB) { Heavy(tb, "slow") })
	if !strings.HasPrefix(r.skipped, "[heavy] slow") {
		t.Fatalf("Heavy with %s=1: skipped %q, failed %q", HeavyEnv, r.skipped, r.failed)
	}
}
