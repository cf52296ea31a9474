package deploy_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/crypt"
)

// cryptFlags are the node plugin's --crypt-* flags (cmd/raid10-csi/main.go) and the field of
// crypt.Options each sets.
var cryptFlags = []struct {
	flag  string
	value string // the chart's value under node.crypt
}{
	{"crypt-pbkdf", "pbkdf"},
	{"crypt-pbkdf-memory-kib", "memoryKiB"},
	{"crypt-iter-time-ms", "iterTimeMs"},
	{"crypt-pbkdf-force-iterations", "forceIterations"},
}

// parseCryptFlags reads the --crypt-* flags among args into crypt.Options as the plugin's
// flags do; any other --crypt- flag fails the test.
func parseCryptFlags(t *testing.T, args []string) (crypt.Options, []string) {
	t.Helper()
	var o crypt.Options
	fs := flag.NewFlagSet("raid10-csi", flag.ContinueOnError)
	fs.StringVar(&o.PBKDF, "crypt-pbkdf", "", "")
	fs.IntVar(&o.PBKDFMemoryKiB, "crypt-pbkdf-memory-kib", 0, "")
	fs.IntVar(&o.IterTimeMs, "crypt-iter-time-ms", 0, "")
	fs.IntVar(&o.ForceIterations, "crypt-pbkdf-force-iterations", 0, "")
	var mine []string
	for _, a := range args {
		if strings.HasPrefix(a, "--crypt-") {
			mine = append(mine, a)
		}
	}
	if err := fs.Parse(mine); err != nil {
		t.Fatalf("the node plugin's args %v: %v", mine, err)
	}
	return o, mine
}

// TestHelmCryptValues: node.crypt reaches the node plugin as its --crypt-* flags (none with
// the defaults: cryptsetup's own key derivation), and the schema accepts exactly the
// settings crypt.Options.Validate accepts (the check the plugin makes at start), so a value
// the plugin would refuse fails at helm install, not in a crash-looping DaemonSet.
func TestHelmCryptValues(t *testing.T) {
	main, err := os.ReadFile("../../cmd/raid10-csi/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range cryptFlags {
		if !strings.Contains(string(main), `"`+f.flag+`"`) {
			t.Fatalf("cmd/raid10-csi/main.go has no flag %s: the chart's node.crypt.%s renders it", f.flag, f.value)
		}
	}
	bin := helmBinary(t)
	if o, args := parseCryptFlags(t, stringsOf(nodeContainer(t, renderChart(t, bin))["args"])); len(args) != 0 || o != (crypt.Options{}) {
		t.Fatalf("with the defaults the node plugin gets %v; want no --crypt-* flag", args)
	}
	for _, tc := range []struct {
		name string
		o    crypt.Options
	}{
		{"tests' cheap", crypt.Options{PBKDF: crypt.PBKDFPBKDF2, ForceIterations: 1000}},
		{"argon2id tuned", crypt.Options{PBKDF: crypt.PBKDFArgon2id, PBKDFMemoryKiB: 262144, IterTimeMs: 1000}},
		{"argon2i forced", crypt.Options{PBKDF: crypt.PBKDFArgon2i, ForceIterations: 4}},
		{"memory alone", crypt.Options{PBKDFMemoryKiB: 4 << 20}},
		{"unknown pbkdf", crypt.Options{PBKDF: "scrypt"}},
		{"pbkdf2 with memory", crypt.Options{PBKDF: crypt.PBKDFPBKDF2, PBKDFMemoryKiB: 1024}},
		{"pbkdf2 too few", crypt.Options{PBKDF: crypt.PBKDFPBKDF2, ForceIterations: 999}},
		{"argon2 too few", crypt.Options{ForceIterations: 3}},
		{"forced and timed", crypt.Options{ForceIterations: 8, IterTimeMs: 100}},
		{"memory above 4 GiB", crypt.Options{PBKDFMemoryKiB: 4<<20 + 1}},
		{"negative", crypt.Options{IterTimeMs: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := []string{"--set-string", "node.crypt.pbkdf=" + tc.o.PBKDF,
				"--set", fmt.Sprintf("node.crypt.memoryKiB=%d", tc.o.PBKDFMemoryKiB),
				"--set", fmt.Sprintf("node.crypt.iterTimeMs=%d", tc.o.IterTimeMs),
				"--set", fmt.Sprintf("node.crypt.forceIterations=%d", tc.o.ForceIterations)}
			args := append([]string{"template", "raid10-csi", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, set...)
			out, stderr, err := helm(t, bin, args...)
			valid := tc.o.Validate()
			switch {
			case valid != nil && err == nil:
				t.Fatalf("helm template %v succeeded; the plugin would refuse it at start: %v", set, valid)
			case valid != nil:
				if !strings.Contains(stderr, "at '/node/crypt") {
					t.Fatalf("helm template %v: the schema's error does not name /node/crypt:\n%s", set, stderr)
				}
				return
			case err != nil:
				t.Fatalf("helm template %v: %v; want it accepted as the plugin accepts it:\n%s", set, err, stderr)
			}
			got, flags := parseCryptFlags(t, stringsOf(nodeContainer(t, decodeObjects(t, out))["args"]))
			if got != tc.o {
				t.Fatalf("node plugin flags %v give %+v; want %+v", flags, got, tc.o)
			}
		})
	}
}
