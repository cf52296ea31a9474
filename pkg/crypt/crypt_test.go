package crypt

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// fastKDF keeps the tests' key derivations short (pbkdf2 at its fewest iterations, no
// benchmark); production uses cryptsetup's defaults.
var fastKDF = Options{PBKDF: PBKDFPBKDF2, ForceIterations: 1000}

// realCryptsetup is a Cryptsetup over the real binary, with blkid (mount-utils) as its
// probe: the same check that guards mkfs in the node plugin.
func realCryptsetup(t *testing.T) *Cryptsetup {
	testenv.RequireTools(t, "cryptsetup", "blkid", "mkfs.ext4")
	ex := utilexec.New()
	fm := mount.NewSafeFormatAndMount(mount.NewFakeMounter(nil), ex)
	return New(ex, fm.GetDiskFormat, fastKDF)
}

func blankFile(t *testing.T, size int64) string {
	p := filepath.Join(t.TempDir(), "dev.img")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	return p
}

func fileSum(t *testing.T, p string) [32]byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// keyslotKDF is the key derivation function and iteration count of keyslot 0 of the LUKS2
// header on dev, as luksDump's JSON metadata has them.
func keyslotKDF(t *testing.T, dev string) (string, int) {
	t.Helper()
	out, err := exec.Command("cryptsetup", "luksDump", "--dump-json-metadata", dev).Output()
	if err != nil {
		t.Fatalf("luksDump %s: %v", dev, err)
	}
	var md struct {
		Keyslots map[string]struct {
			KDF struct {
				Type       string `json:"type"`
				Iterations int    `json:"iterations"`
			} `json:"kdf"`
		} `json:"keyslots"`
	}
	if err := json.Unmarshal(out, &md); err != nil {
		t.Fatalf("luksDump %s: %v", dev, err)
	}
	ks := md.Keyslots["0"].KDF
	return ks.Type, ks.Iterations
}

// TestFormatRealCryptsetup: a blank device is formatted as LUKS2, its keyslot with the
// options' key derivation, and then refused; a device
// holding a filesystem is refused and left byte for byte as it was.
func TestFormatRealCryptsetup(t *testing.T) {
	c := realCryptsetup(t)
	ctx := context.Background()
	dev := blankFile(t, 32<<20)
	if luks, err := c.IsLUKS(ctx, dev); err != nil || luks {
		t.Fatalf("IsLUKS(blank) = %v, %v; want false, nil", luks, err)
	}
	if err := c.Format(ctx, dev, []byte("k1")); err != nil {
		t.Fatalf("Format(blank): %v", err)
	}
	if luks, err := c.IsLUKS(ctx, dev); err != nil || !luks {
		t.Fatalf("IsLUKS(formatted) = %v, %v; want true, nil", luks, err)
	}
	if kdf, iter := keyslotKDF(t, dev); kdf != PBKDFPBKDF2 || iter != 1000 {
		t.Fatalf("keyslot 0 derives its key with %s, %d iterations; want the options' pbkdf2, 1000", kdf, iter)
	}
	before := fileSum(t, dev)
	if err := c.Format(ctx, dev, []byte("k2")); !errors.Is(err, ErrAlreadyLUKS) {
		t.Fatalf("Format(LUKS) = %v; want ErrAlreadyLUKS", err)
	}
	if fileSum(t, dev) != before {
		t.Fatal("the refused Format changed the LUKS device")
	}

	fs := blankFile(t, 32<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", fs).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	before = fileSum(t, fs)
	err := c.Format(ctx, fs, []byte("k1"))
	if !errors.Is(err, ErrNotBlank) || !strings.Contains(err.Error(), "ext4") {
		t.Fatalf("Format(ext4) = %v; want ErrNotBlank naming ext4", err)
	}
	if fileSum(t, fs) != before {
		t.Fatal("the refused Format changed the ext4 device")
	}
	if err := c.Format(ctx, blankFile(t, 32<<20), nil); !errors.Is(err, ErrEmptyKey) {
		t.Fatalf("Format(empty key) = %v; want ErrEmptyKey", err)
	}
}

// call is one cryptsetup run the fake saw.
type call struct {
	args  []string
	stdin string
}

// fakeCryptsetup answers cryptsetup calls from answer (its output and exit status, 0 for
// success) and records them.
func fakeCryptsetup(t *testing.T, answer func(args []string) (string, int)) (*Cryptsetup, *[]call) {
	calls := &[]call{}
	fe := &testingexec.FakeExec{ExactOrder: false}
	fe.CommandScript = make([]testingexec.FakeCommandAction, 20)
	for i := range fe.CommandScript {
		fe.CommandScript[i] = func(cmd string, args ...string) utilexec.Cmd {
			fc := &testingexec.FakeCmd{}
			fc.CombinedOutputScript = []testingexec.FakeAction{func() ([]byte, []byte, error) {
				var in []byte
				if fc.Stdin != nil {
					in, _ = io.ReadAll(fc.Stdin)
				}
				*calls = append(*calls, call{args: args, stdin: string(in)})
				out, code := answer(args)
				if code != 0 {
					return []byte(out), nil, &testingexec.FakeExitError{Status: code}
				}
				return []byte(out), nil, nil
			}}
			return testingexec.InitFakeCmd(fc, cmd, args...)
		}
	}
	probe := func(string) (string, error) { return "", nil }
	return New(fe, probe, Options{MapperDir: t.TempDir()}), calls
}

// TestOpenErrors: a wrong key (exit status 2) is ErrWrongKey and the key went on standard
// input, never into the arguments; a device without a header is ErrNotLUKS and is not
// opened.
func TestOpenErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		isLuks  int
		open    int
		want    error
		wantRun []string // the verbs run, in order
	}{
		{"wrong key", 0, exitWrongKey, ErrWrongKey, []string{"isLuks", "open"}},
		{"not LUKS", exitNotLUKS, 0, ErrNotLUKS, []string{"isLuks"}},
		{"opened", 0, 0, nil, []string{"isLuks", "open"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, calls := fakeCryptsetup(t, func(args []string) (string, int) {
				switch args[0] {
				case "isLuks":
					return "", tc.isLuks
				case "open":
					return "No key available with this passphrase.", tc.open
				}
				return "unexpected", 1
			})
			key := "s3cret-key"
			path, err := c.Open(context.Background(), "/dev/nbd7", "m", []byte(key))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open = %q, %v; want %v", path, err, tc.want)
			}
			var verbs []string
			for _, cl := range *calls {
				verbs = append(verbs, cl.args[0])
				if slices.ContainsFunc(cl.args, func(a string) bool { return strings.Contains(a, key) }) {
					t.Fatalf("the key is on the command line: %q", cl.args)
				}
				if cl.args[0] == "open" {
					if cl.stdin != key || !slices.Contains(cl.args, "--key-file=-") || !slices.Contains(cl.args, "--disable-keyring") {
						t.Fatalf("open %q with stdin %q: want --key-file=- --disable-keyring and the key on stdin", cl.args, cl.stdin)
					}
				}
			}
			if !slices.Equal(verbs, tc.wantRun) {
				t.Fatalf("ran %v; want %v", verbs, tc.wantRun)
			}
			if tc.want == nil && path != c.Path("m") {
				t.Fatalf("path %q; want %q", path, c.Path("m"))
			}
		})
	}
}

// TestFormatArgs: luksFormat of LUKS2 with the key on standard input and the key
// derivation asked; the zero Options (production's default) pass no key-derivation
// argument, so the header gets cryptsetup's argon2id at its benchmarked cost. A probe that
// finds a signature stops it before luksFormat.
func TestFormatArgs(t *testing.T) {
	base := []string{"luksFormat", "--type", "luks2", "--batch-mode", "--key-file=-"}
	for _, tc := range []struct {
		name string
		opts Options
		kdf  []string
	}{
		{"default", Options{}, nil},
		{"argon2 tuned", Options{PBKDFMemoryKiB: 65536, IterTimeMs: 500}, []string{"--pbkdf-memory", "65536", "--iter-time", "500"}},
		{"pbkdf2 forced", Options{PBKDF: PBKDFPBKDF2, ForceIterations: 1000}, []string{"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, calls := fakeCryptsetup(t, func(args []string) (string, int) {
				if args[0] == "isLuks" {
					return "", exitNotLUKS
				}
				return "", 0
			})
			c.opts = tc.opts
			if err := c.Format(context.Background(), "/dev/nbd3", []byte("k")); err != nil {
				t.Fatal(err)
			}
			got := (*calls)[len(*calls)-1]
			want := append(append(slices.Clone(base), tc.kdf...), "/dev/nbd3")
			if !slices.Equal(got.args, want) || got.stdin != "k" {
				t.Fatalf("ran %q stdin %q; want %q stdin k", got.args, got.stdin, want)
			}
		})
	}
	c, calls := fakeCryptsetup(t, func(args []string) (string, int) {
		if args[0] == "isLuks" {
			return "", exitNotLUKS
		}
		return "", 0
	})
	c.probe = func(string) (string, error) { return "xfs", nil }
	if err := c.Format(context.Background(), "/dev/nbd3", []byte("k")); !errors.Is(err, ErrNotBlank) {
		t.Fatalf("Format(xfs) = %v; want ErrNotBlank", err)
	}
	if len(*calls) != 1 { // isLuks only
		t.Fatalf("ran %v after the probe found xfs", *calls)
	}
}

// TestOptionsValidate: what cryptsetup would refuse is refused up front, naming the setting.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want string // "" valid, else a part of the error
	}{
		{"default", Options{}, ""},
		{"tests' cheap", fastKDF, ""},
		{"argon2id tuned", Options{PBKDF: PBKDFArgon2id, PBKDFMemoryKiB: 65536, IterTimeMs: 200}, ""},
		{"argon2 forced", Options{PBKDF: PBKDFArgon2i, ForceIterations: 4}, ""},
		{"unknown", Options{PBKDF: "scrypt"}, `pbkdf "scrypt"`},
		{"pbkdf2 memory", Options{PBKDF: PBKDFPBKDF2, PBKDFMemoryKiB: 1024}, "memory"},
		{"both", Options{ForceIterations: 8, IterTimeMs: 100}, "not both"},
		{"pbkdf2 too few", Options{PBKDF: PBKDFPBKDF2, ForceIterations: 999}, "at least 1000"},
		{"argon2 too few", Options{ForceIterations: 3}, "at least 4 for argon2id"},
		{"negative", Options{IterTimeMs: -1}, "negative"},
		{"argon2 memory at most", Options{PBKDFMemoryKiB: 4 << 20}, ""},
		{"argon2 memory above 4 GiB", Options{PBKDFMemoryKiB: 4<<20 + 1}, "at most 4194304"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate(%+v) = %v; want %q", tc.opts, err, tc.want)
			}
		})
	}
}

// TestCloseInactive: closing a mapping that is not active runs nothing and succeeds.
func TestCloseInactive(t *testing.T) {
	c, calls := fakeCryptsetup(t, func([]string) (string, int) { return "", 1 })
	if err := c.Close(context.Background(), "gone"); err != nil || len(*calls) != 0 {
		t.Fatalf("Close = %v after %d calls; want nil after none", err, len(*calls))
	}
}

func TestMapperName(t *testing.T) {
	if got := MapperName("pvc-1234.a_b"); got != "raid10-crypt-pvc-1234.a_b" {
		t.Fatalf("MapperName(plain) = %q", got)
	}
	long := strings.Repeat("x", 200)
	for _, id := range []string{"ns/vol", long, "a b"} {
		got := MapperName(id)
		if len(got) > 127 || strings.ContainsAny(got, "/ ") || got != MapperName(id) {
			t.Fatalf("MapperName(%q) = %q: not a stable, valid dm name", id, got)
		}
	}
	if MapperName("ns/vol") == MapperName("ns/vom") {
		t.Fatal("two IDs share a mapper name")
	}
}
