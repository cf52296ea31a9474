package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
)

// cryptExec is fakeExec with a scripted cryptsetup: isLuks answers luks; luksFormat makes
// the device LUKS with its stdin as keyslot 0's passphrase; open (and open --test-passphrase
// [--key-slot N]) succeeds when its stdin is the passphrase of a keyslot, or, for a header
// set up with luks alone (no slots), exits with openRC; luksDump lists the keyslots,
// luksAddKey adds one (both keys on stdin by their sizes, the previous one checked),
// luksKillSlot wipes one. blkid reports what fs says (the fake's own mkfs included). It
// records each cryptsetup call's arguments and what it read on its standard input.
type cryptExec struct {
	*fakeExec
	mu     sync.Mutex
	luks   bool           // the device has a LUKS header
	slots  map[int]string // its keyslots' passphrases; nil: open answers openRC
	openRC int            // exit status of cryptsetup open without slots
	verbs  []string
	args   [][]string
	stdins []string
}

func (e *cryptExec) CommandContext(_ context.Context, cmd string, args ...string) utilexec.Cmd {
	return e.Command(cmd, args...)
}

func (e *cryptExec) Command(cmd string, args ...string) utilexec.Cmd {
	if cmd != "cryptsetup" {
		return e.fakeExec.Command(cmd, args...)
	}
	fc := &testingexec.FakeCmd{}
	fc.CombinedOutputScript = []testingexec.FakeAction{func() ([]byte, []byte, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		var in []byte
		if fc.Stdin != nil {
			in, _ = io.ReadAll(fc.Stdin)
		}
		e.verbs, e.args, e.stdins = append(e.verbs, args[0]), append(e.args, args), append(e.stdins, string(in))
		out, rc := e.answer(args, string(in))
		if rc != 0 {
			return []byte(out), nil, &testingexec.FakeExitError{Status: rc}
		}
		return []byte(out), nil, nil
	}}
	return fc
}

// answer is the scripted cryptsetup's output and exit status for args with stdin.
func (e *cryptExec) answer(args []string, stdin string) (string, int) {
	flag := func(name string) string {
		if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
			return args[i+1]
		}
		return ""
	}
	opens := func(pass, slot string) bool {
		for n, p := range e.slots {
			if p == pass && (slot == "" || slot == strconv.Itoa(n)) {
				return true
			}
		}
		return false
	}
	switch args[0] {
	case "isLuks":
		if !e.luks {
			return "", 1
		}
	case "luksFormat":
		e.luks, e.slots = true, map[int]string{0: stdin}
	case "open":
		switch {
		case e.slots == nil:
			return "", e.openRC
		case !opens(stdin, flag("--key-slot")):
			return "No key available with this passphrase.", 2
		}
	case "luksDump":
		var parts []string
		for n := range e.slots {
			parts = append(parts, fmt.Sprintf(`"%d":{"type":"luks2"}`, n))
		}
		return `{"keyslots":{` + strings.Join(parts, ",") + `}}`, 0
	case "luksAddKey":
		n, _ := strconv.Atoi(flag("--keyfile-size"))
		if !opens(stdin[:n], "") {
			return "No key available with this passphrase.", 2
		}
		slot, _ := strconv.Atoi(flag("--key-slot"))
		e.slots[slot] = stdin[n:]
	case "luksKillSlot":
		slot, _ := strconv.Atoi(args[len(args)-1])
		delete(e.slots, slot)
	}
	return "", 0
}

func (e *cryptExec) ran() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.verbs, " ")
}

func newCryptNode(t *testing.T) (*NodeServer, *cryptExec) {
	t.Helper()
	m := mount.NewFakeMounter(nil)
	ex := &cryptExec{fakeExec: &fakeExec{fs: map[string]string{}}}
	n, err := NewNodeServer(NodeConfig{NodeID: "node-a", Attacher: newFakeAttacher("vol-1"), Mounter: m, Exec: ex,
		Mounts: mounterTable{m}, Crypt: crypt.Options{MapperDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	return n, ex
}

// TestNodeStageEncryptedFake: the key flow of NodeStageVolume for an encrypted volume, with
// a scripted cryptsetup. A missing secret or field is InvalidArgument naming it and runs no
// cryptsetup; a wrong key is FailedPrecondition naming the volume and formats nothing; a
// device with data but no LUKS header is refused unformatted; a blank one gets a header
// (the key on stdin) and the filesystem goes on the mapping.
func TestNodeStageEncryptedFake(t *testing.T) {
	enc := map[string]string{ParamEncrypted: "true"}
	for _, tc := range []struct {
		name     string
		secrets  map[string]string
		luks     bool   // the device has a header already
		data     string // a filesystem on the raw device
		openRC   int
		want     codes.Code
		wantText string // the error names it
		wantRan  string // cryptsetup verbs run
	}{
		{name: "no secret", want: codes.InvalidArgument, wantText: "node-stage-secret-name", wantRan: ""},
		{name: "no key field", secrets: map[string]string{"passphrase": "x"}, want: codes.InvalidArgument, wantText: `no field "key"`, wantRan: ""},
		{name: "wrong key", secrets: map[string]string{"key": "bad"}, luks: true, openRC: 2, want: codes.FailedPrecondition, wantText: "wrong key", wantRan: "isLuks open"},
		{name: "data without header", secrets: map[string]string{"key": "k"}, data: "ext4", want: codes.FailedPrecondition, wantText: "not blank", wantRan: "isLuks isLuks"},
		{name: "blank", secrets: map[string]string{"key": "k"}, want: codes.OK, wantRan: "isLuks isLuks luksFormat isLuks open"},
		{name: "reopen", secrets: map[string]string{"key": "k"}, luks: true, want: codes.OK, wantRan: "isLuks open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, ex := newCryptNode(t)
			ex.luks, ex.openRC = tc.luks, tc.openRC
			if tc.data != "" {
				ex.fs["/dev/fake0"] = tc.data
			}
			_, err := n.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: "vol-1",
				StagingTargetPath: t.TempDir(), VolumeCapability: mountCap("ext4"), VolumeContext: enc, Secrets: tc.secrets})
			if got := status.Code(toStatus(err)); got != tc.want {
				t.Fatalf("code %s, want %s: %v", got, tc.want, err)
			}
			if err != nil && (!strings.Contains(err.Error(), tc.wantText) || !strings.Contains(err.Error(), `"vol-1"`)) {
				t.Fatalf("error %q: want it to name %q and the volume", err, tc.wantText)
			}
			if got := ex.ran(); got != tc.wantRan {
				t.Fatalf("cryptsetup ran %q, want %q", got, tc.wantRan)
			}
			for i, v := range ex.verbs {
				if (v == "luksFormat" || v == "open") && ex.stdins[i] != tc.secrets["key"] {
					t.Fatalf("%s read %q on stdin, want the key", v, ex.stdins[i])
				}
			}
			mkfs := ex.fakeExec.ran("mkfs.ext4")
			if tc.want != codes.OK && mkfs != 0 {
				t.Fatal("mkfs ran after a failed open")
			}
			if tc.want == codes.OK {
				mapper := n.cryptsetup().Path(crypt.MapperName("vol-1"))
				if ex.fs[mapper] != "ext4" || ex.fs["/dev/fake0"] != "" {
					t.Fatalf("filesystems made %v: want ext4 on %s only", ex.fs, mapper)
				}
			}
		})
	}
}

// TestNodeStageRotateFake: NodeStageVolume with a node-stage secret that carries the key
// and the previous key (a rotation), on a scripted cryptsetup with a header of keyslots. The
// header known by the previous key only gets a keyslot for the key (luksAddKey, before the
// previous one's is wiped), then opens with the key; a header cut between the two steps is
// finished; a rotated one is left alone; neither key is FailedPrecondition naming the
// volume with the header unchanged and no mkfs; a blank device gets its header from the key.
// Neither key is ever on a command line.
func TestNodeStageRotateFake(t *testing.T) {
	const oldKey, newKey = "0ld-Secret", "N3w-Secret!"
	rotating := map[string]string{SecretKeyField: newKey, SecretPreviousKeyField: oldKey}
	for _, tc := range []struct {
		name      string
		slots     map[int]string // nil: a blank device
		secrets   map[string]string
		want      codes.Code
		wantSlots map[int]string
		wantRan   string // cryptsetup verbs run
	}{
		{name: "rotate", slots: map[int]string{0: oldKey}, secrets: rotating, want: codes.OK,
			wantSlots: map[int]string{1: newKey}, wantRan: "isLuks luksDump open luksAddKey open luksKillSlot isLuks open"},
		{name: "finish a cut rotation", slots: map[int]string{0: oldKey, 1: newKey}, secrets: rotating, want: codes.OK,
			wantSlots: map[int]string{1: newKey}, wantRan: "isLuks luksDump open open open luksKillSlot isLuks open"},
		{name: "rotated already", slots: map[int]string{1: newKey}, secrets: rotating, want: codes.OK,
			wantSlots: map[int]string{1: newKey}, wantRan: "isLuks luksDump open isLuks open"},
		{name: "recovery keyslot kept", slots: map[int]string{0: "recovery", 1: oldKey}, secrets: rotating, want: codes.OK,
			wantSlots: map[int]string{0: "recovery", 2: newKey}, wantRan: "isLuks luksDump open open luksAddKey open open luksKillSlot isLuks open"},
		{name: "neither key", slots: map[int]string{0: "other volume's"}, secrets: rotating, want: codes.FailedPrecondition,
			wantSlots: map[int]string{0: "other volume's"}, wantRan: "isLuks luksDump open luksAddKey"},
		{name: "previous equals key", slots: map[int]string{0: newKey}, secrets: map[string]string{SecretKeyField: newKey, SecretPreviousKeyField: newKey},
			want: codes.OK, wantSlots: map[int]string{0: newKey}, wantRan: "isLuks open"},
		{name: "blank", secrets: rotating, want: codes.OK, wantSlots: map[int]string{0: newKey}, wantRan: "isLuks isLuks isLuks luksFormat isLuks open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, ex := newCryptNode(t)
			ex.luks, ex.slots = tc.slots != nil, maps.Clone(tc.slots)
			_, err := n.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: "vol-1",
				StagingTargetPath: t.TempDir(), VolumeCapability: mountCap("ext4"), VolumeContext: map[string]string{ParamEncrypted: "true"},
				Secrets: tc.secrets})
			if got := status.Code(toStatus(err)); got != tc.want {
				t.Fatalf("code %s, want %s: %v", got, tc.want, err)
			}
			if err != nil && (!strings.Contains(err.Error(), "wrong key") || !strings.Contains(err.Error(), `"vol-1"`) ||
				!strings.Contains(err.Error(), SecretPreviousKeyField)) {
				t.Fatalf("error %q: want it to name the volume, the previous key and a wrong key", err)
			}
			if !maps.Equal(ex.slots, tc.wantSlots) {
				t.Fatalf("keyslots %v, want %v", ex.slots, tc.wantSlots)
			}
			if got := ex.ran(); got != tc.wantRan {
				t.Fatalf("cryptsetup ran %q, want %q", got, tc.wantRan)
			}
			for _, args := range ex.args {
				if slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "Secret") }) {
					t.Fatalf("a key is on the command line: %q", args)
				}
			}
			if mkfs := ex.fakeExec.ran("mkfs.ext4"); (tc.want == codes.OK) != (mkfs == 1) {
				t.Fatalf("mkfs ran %d times; want once on success, never on failure", mkfs)
			}
		})
	}
}

// TestNodePublishEncryptedBlockNotOpen: a Block encrypted volume whose mapping is not open
// is not published (the raw device would expose the header to the pod).
func TestNodePublishEncryptedBlockNotOpen(t *testing.T) {
	n, _ := newCryptNode(t)
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	_, err := n.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: "vol-1",
		StagingTargetPath: t.TempDir(), TargetPath: t.TempDir() + "/dev", VolumeCapability: block,
		VolumeContext: map[string]string{ParamEncrypted: "true"}})
	if !errors.Is(err, ErrFailedPrecondition) || !strings.Contains(err.Error(), "not open") {
		t.Fatalf("publish = %v; want FailedPrecondition: mapping not open", err)
	}
}

func TestParseEncrypted(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    bool
		wantErr bool
	}{{"true", true, false}, {"false", false, false}, {"yes", false, true}, {"", false, true}} {
		p, err := parseParams(map[string]string{ParamEncrypted: tc.in})
		if (err != nil) != tc.wantErr || p.encrypted != tc.want {
			t.Fatalf("parseParams(encrypted=%q) = %v, %v", tc.in, p.encrypted, err)
		}
		if err != nil && (!errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), ParamEncrypted)) {
			t.Fatalf("error %v: want InvalidArgument naming %s", err, ParamEncrypted)
		}
	}
	if vc := withEncrypted(nil, volumeParams{encrypted: true}); !isEncrypted(vc) {
		t.Fatalf("volume context %v: not encrypted", vc)
	}
	if vc := withEncrypted(map[string]string{ParamFrontend: "nbd"}, volumeParams{}); isEncrypted(vc) || len(vc) != 1 {
		t.Fatalf("volume context %v: want the frontend only", vc)
	}
}

// TestNewVolumeEncryptedAnnotation: a volume created with encrypted=true carries the
// annotation kubectl raid10 describe reads; one without has none.
func TestNewVolumeEncryptedAnnotation(t *testing.T) {
	p, err := parseParams(map[string]string{ParamEncrypted: "true"})
	if err != nil {
		t.Fatal(err)
	}
	vol := newVolume("vol-1", "pvc-1", "node-a", 1<<30, p, volumeShape{mode: "Filesystem", fsType: "ext4"})
	if got := vol.Annotations[v1alpha1.EncryptedAnnotation]; got != "true" {
		t.Fatalf("annotation %q = %q, want true", v1alpha1.EncryptedAnnotation, got)
	}
	plain := newVolume("vol-2", "pvc-2", "node-a", 1<<30, volumeParams{}, volumeShape{mode: "Filesystem", fsType: "ext4"})
	if _, ok := plain.Annotations[v1alpha1.EncryptedAnnotation]; ok {
		t.Fatalf("a plain volume has annotations %v", plain.Annotations)
	}
}

// TestSameEncryption: a repeated CreateVolume that differs in encrypted is AlreadyExists.
func TestSameEncryption(t *testing.T) {
	enc := newVolume("vol-1", "pvc-1", "node-a", 1<<30, volumeParams{encrypted: true}, volumeShape{mode: "Filesystem", fsType: "ext4"})
	plain := newVolume("vol-2", "pvc-2", "node-a", 1<<30, volumeParams{}, volumeShape{mode: "Filesystem", fsType: "ext4"})
	for _, tc := range []struct {
		name string
		vol  *v1alpha1.Raid10Volume
		ask  bool
		want error
	}{
		{"encrypted again", enc, true, nil},
		{"plain again", plain, false, nil},
		{"plain asked of an encrypted one", enc, false, ErrAlreadyExists},
		{"encrypted asked of a plain one", plain, true, ErrAlreadyExists},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := sameEncryption(tc.vol, volumeParams{encrypted: tc.ask})
			if !errors.Is(err, tc.want) || (err != nil && !strings.Contains(err.Error(), ParamEncrypted)) {
				t.Fatalf("sameEncryption = %v, want %v naming %s", err, tc.want, ParamEncrypted)
			}
		})
	}
}
