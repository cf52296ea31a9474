package crypt

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// opens reports whether key opens a keyslot of dev's header (real cryptsetup, nothing
// mapped).
func opens(t *testing.T, dev, key string) bool {
	t.Helper()
	cmd := exec.Command("cryptsetup", "open", "--test-passphrase", "--type", "luks2", "--key-file=-", dev)
	cmd.Stdin = strings.NewReader(key)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == exitWrongKey {
		return false
	}
	if err != nil {
		t.Fatalf("cryptsetup open --test-passphrase %s: %v: %s", dev, err, out)
	}
	return true
}

// volumeKeyDump is luksDump's dump of the volume key, unlocked by key: equal dumps are the
// same volume key, the one that encrypts the data.
func volumeKeyDump(t *testing.T, dev, key string) string {
	t.Helper()
	cmd := exec.Command("cryptsetup", "luksDump", "--dump-volume-key", "--batch-mode", "--key-file=-", dev)
	cmd.Stdin = strings.NewReader(key)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("MK dump:")) {
		t.Fatalf("luksDump --dump-volume-key %s: %v: %s", dev, err, out)
	}
	_, mk, _ := strings.Cut(string(out), "MK dump:")
	return mk
}

// dataSum is the hash of dev after its 16 MiB LUKS2 header: the data area.
func dataSum(t *testing.T, dev string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(dev)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b[16<<20:])
}

// TestRotateRealCryptsetup: key rotation on a real LUKS2 header (cryptsetup on a file; no
// device-mapper needed). Two wrong keys change nothing; a rotation gives the new key a
// keyslot, wipes the old one's, keeps the volume key and the data area byte for byte; a
// repeat does nothing; a rotation cut after its first step (the new keyslot added, the old
// not wiped) opens with either key and the next Rotate finishes it; a keyslot of neither key
// (a recovery passphrase) survives.
func TestRotateRealCryptsetup(t *testing.T) {
	c := realCryptsetup(t)
	ctx := context.Background()
	dev := blankFile(t, 20<<20) // the 16 MiB header and 4 MiB of data
	if err := c.Format(ctx, dev, []byte("old-key")); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	if _, err := f.WriteAt(data, 16<<20); err != nil || f.Close() != nil {
		t.Fatalf("write the data area: %v", err)
	}
	vk, sumData := volumeKeyDump(t, dev, "old-key"), dataSum(t, dev)

	before := fileSum(t, dev)
	if _, err := c.Rotate(ctx, dev, []byte("wrong-new"), []byte("wrong-old")); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("Rotate(two wrong keys) = %v; want ErrWrongKey", err)
	}
	if fileSum(t, dev) != before {
		t.Fatal("Rotate with two wrong keys changed the device")
	}

	res, err := c.Rotate(ctx, dev, []byte("new-key"), []byte("old-key"))
	if err != nil || res != (RotateResult{Rotation: RotationRotated, KeySlot: 1, Wiped: 0}) {
		t.Fatalf("Rotate(new, old) = %+v, %v; want rotated into keyslot 1, keyslot 0 wiped", res, err)
	}
	if opens(t, dev, "old-key") || !opens(t, dev, "new-key") {
		t.Fatal("after the rotation: want the new key to open the header and the old one not")
	}
	if got := volumeKeyDump(t, dev, "new-key"); got != vk {
		t.Fatalf("the volume key changed in the rotation:\n%s\nwas\n%s", got, vk)
	}
	if dataSum(t, dev) != sumData {
		t.Fatal("the rotation wrote in the data area")
	}
	if slots, err := c.Keyslots(ctx, dev); err != nil || !slices.Equal(slots, []int{1}) {
		t.Fatalf("keyslots %v, %v; want [1]", slots, err)
	}
	before = fileSum(t, dev)
	if res, err := c.Rotate(ctx, dev, []byte("new-key"), []byte("old-key")); err != nil || res.Rotation != RotationNone || res.KeySlot != 1 {
		t.Fatalf("Rotate again = %+v, %v; want none, the key in keyslot 1", res, err)
	}
	if fileSum(t, dev) != before {
		t.Fatal("a rotation with nothing to do changed the device")
	}

	// Cut between the steps: the next key's keyslot is added (keyslot 0, the lowest free),
	// the previous one's not wiped.
	if slot, err := c.addKey(ctx, dev, []byte("new-key"), []byte("next-key"), []int{1}); err != nil || slot != 0 {
		t.Fatalf("addKey = %d, %v; want keyslot 0", slot, err)
	}
	if !opens(t, dev, "new-key") || !opens(t, dev, "next-key") {
		t.Fatal("cut after the add: want the header to open with either key")
	}
	res, err = c.Rotate(ctx, dev, []byte("next-key"), []byte("new-key"))
	if err != nil || res != (RotateResult{Rotation: RotationFinished, KeySlot: 0, Wiped: 1}) {
		t.Fatalf("Rotate after the cut = %+v, %v; want finished: the key in keyslot 0, keyslot 1 wiped", res, err)
	}
	if opens(t, dev, "new-key") || volumeKeyDump(t, dev, "next-key") != vk {
		t.Fatal("after the finished rotation: want the previous key refused and the same volume key")
	}
	if kdf, iter := keyslotKDF(t, dev); kdf != PBKDFPBKDF2 || iter != 1000 {
		t.Fatalf("the added keyslot derives with %s, %d iterations; want the options' pbkdf2, 1000", kdf, iter)
	}

	// A recovery passphrase in another keyslot stays through a rotation.
	if _, err := c.addKey(ctx, dev, []byte("next-key"), []byte("recovery"), []int{0}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Rotate(ctx, dev, []byte("last-key"), []byte("next-key")); err != nil || res.Rotation != RotationRotated || res.Wiped != 0 {
		t.Fatalf("Rotate beside a recovery keyslot = %+v, %v; want rotated, keyslot 0 wiped", res, err)
	}
	if !opens(t, dev, "recovery") || !opens(t, dev, "last-key") || opens(t, dev, "next-key") {
		t.Fatal("after a rotation beside a recovery keyslot: want recovery and the new key to open, the previous not")
	}
	if dataSum(t, dev) != sumData {
		t.Fatal("the rotations wrote in the data area")
	}

	for _, tc := range []struct {
		name          string
		dev           string
		key, previous string
		want          error
	}{
		{"same key", dev, "last-key", "last-key", ErrSameKey},
		{"empty previous", dev, "last-key", "", ErrEmptyKey},
		{"no header", blankFile(t, 32<<20), "a", "b", ErrNotLUKS},
	} {
		before := fileSum(t, tc.dev)
		if _, err := c.Rotate(ctx, tc.dev, []byte(tc.key), []byte(tc.previous)); !errors.Is(err, tc.want) {
			t.Fatalf("%s: Rotate = %v; want %v", tc.name, err, tc.want)
		}
		if fileSum(t, tc.dev) != before {
			t.Fatalf("%s: the refused Rotate changed the device", tc.name)
		}
	}
}

// luksSim is a scripted cryptsetup with a header of keyslots (number -> passphrase) for
// the fake exec: isLuks, luksDump's keyslots, open --test-passphrase [--key-slot],
// luksAddKey (both keys on stdin by their sizes) and luksKillSlot.
type luksSim struct{ slots map[int]string }

func (s *luksSim) answer(c call) (string, int) {
	flag := func(name string) string {
		if i := slices.Index(c.args, name); i >= 0 && i+1 < len(c.args) {
			return c.args[i+1]
		}
		return ""
	}
	switch c.args[0] {
	case "isLuks":
		return "", 0
	case "luksDump":
		var parts []string
		for n := range s.slots {
			parts = append(parts, `"`+strconv.Itoa(n)+`":{"type":"luks2"}`)
		}
		return `{"keyslots":{` + strings.Join(parts, ",") + `}}`, 0
	case "open":
		for n, p := range s.slots {
			if p == c.stdin && (flag("--key-slot") == "" || flag("--key-slot") == strconv.Itoa(n)) {
				return "", 0
			}
		}
		return "No key available with this passphrase.", exitWrongKey
	case "luksAddKey":
		n, _ := strconv.Atoi(flag("--keyfile-size"))
		prev, key := c.stdin[:n], c.stdin[n:]
		if !slices.Contains(slices.Collect(maps.Values(s.slots)), prev) {
			return "No key available with this passphrase.", exitWrongKey
		}
		slot, _ := strconv.Atoi(flag("--key-slot"))
		s.slots[slot] = key
		return "", 0
	case "luksKillSlot":
		slot, _ := strconv.Atoi(c.args[len(c.args)-1])
		delete(s.slots, slot)
		return "", 0
	}
	return "unexpected", 1
}

// TestRotateArgs: the rotation's commands, in order, with neither key ever on a command
// line: luksAddKey reads the previous key then the new one on standard input (by their
// sizes) and writes the new keyslot with the options' key derivation; luksKillSlot comes
// after it, and wipes the previous key's keyslot, never the new key's.
func TestRotateArgs(t *testing.T) {
	sim := &luksSim{slots: map[int]string{0: "0ldSecret"}}
	var c *Cryptsetup
	var calls *[]call
	c, calls = fakeCryptsetup(t, func(args []string) (string, int) {
		return sim.answer(call{args: args, stdin: (*calls)[len(*calls)-1].stdin})
	})
	c.opts = Options{PBKDF: PBKDFArgon2id, IterTimeMs: 500, MapperDir: c.opts.MapperDir, Binary: "cryptsetup"}
	res, err := c.Rotate(context.Background(), "/dev/nbd4", []byte("N3wSecret"), []byte("0ldSecret"))
	if err != nil || res != (RotateResult{Rotation: RotationRotated, KeySlot: 1, Wiped: 0}) {
		t.Fatalf("Rotate = %+v, %v; want rotated into keyslot 1, keyslot 0 wiped", res, err)
	}
	var verbs []string
	for _, cl := range *calls {
		verbs = append(verbs, cl.args[0])
		if slices.ContainsFunc(cl.args, func(a string) bool { return strings.Contains(a, "Secret") }) {
			t.Fatalf("a key is on the command line: %q", cl.args)
		}
		if cl.args[0] == "luksAddKey" {
			want := []string{"luksAddKey", "--batch-mode", "--key-slot", "1", "--key-file=-", "--keyfile-size", "9",
				"--new-keyfile-size", "9", "--pbkdf", "argon2id", "--iter-time", "500", "/dev/nbd4", "-"}
			if !slices.Equal(cl.args, want) || cl.stdin != "0ldSecretN3wSecret" {
				t.Fatalf("ran %q with stdin %q; want %q with the previous key then the new one", cl.args, cl.stdin, want)
			}
		}
	}
	want := "isLuks luksDump open luksAddKey open luksKillSlot" // the key tried on keyslot 0, the add, the old key found in 0
	if got := strings.Join(verbs, " "); got != want {
		t.Fatalf("ran %s; want %s", got, want)
	}
	if len(sim.slots) != 1 || sim.slots[1] != "N3wSecret" {
		t.Fatalf("keyslots %v; want only 1: the new key", sim.slots)
	}
}
