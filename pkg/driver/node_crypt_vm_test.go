package driver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// luks2HeaderBytes is what cryptsetup's default LUKS2 header takes at the head of the
// device: metadata and keyslots, before the data segment (its offset in luksDump).
const luks2HeaderBytes = 16 << 20

// plainPattern is a recognisable 4 KiB block: a marker naming what wrote it, repeated.
func plainPattern(marker string) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%-64s", marker)), 4096/64)
}

// needleCount counts the occurrences of needle in the file at path, read in 1 MiB pieces
// that overlap by len(needle)-1 bytes so that none is missed at a boundary.
func needleCount(t *testing.T, path string, needle []byte) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20+len(needle)-1)
	n, keep := 0, 0
	for {
		m, err := io.ReadFull(f, buf[keep:])
		chunk := buf[:keep+m]
		n += bytes.Count(chunk, needle)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return n
			}
			t.Fatal(err)
		}
		keep = copy(buf, chunk[len(chunk)-(len(needle)-1):])
	}
}

// onDisks counts needle on every member disk of the pool, read raw.
func onDisks(t *testing.T, cfg pool.Config, needle []byte) int {
	t.Helper()
	total := 0
	for _, d := range cfg.Disks {
		total += needleCount(t, d.Path, needle)
	}
	return total
}

// headSum is the SHA-256 of the first n bytes of dev.
func headSum(t *testing.T, dev string, n int) [32]byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatalf("read the head of %s: %v", dev, err)
	}
	return sha256.Sum256(b)
}

// TestNodeInGuestCrypt: encryption at rest through the real node service, cryptsetup and
// dm-crypt over real /dev/nbdX on a pool of four file disks. A control volume written in
// the clear shows that the raw scan finds a pattern; the same pattern written through an
// encrypted Filesystem and an encrypted Block volume appears on no disk; both read back
// after a re-stage with the key; a wrong key and a missing one fail with clear errors
// and leave the LUKS header byte for byte; a repeated stage, also by a fresh node service,
// keeps the open mapping; a device holding data without a header is not formatted; the
// encrypted filesystem grows online; a snapshot, a restore and a clone keep the source's
// key and hold no plaintext either (cryptCopies).
func TestNodeInGuestCrypt(t *testing.T) {
	vm.GuestHalf(t, "TestNodeVM")
	testenv.RequireTools(t, "cryptsetup", "blkid", "mkfs.ext4", "resize2fs")
	dir := t.TempDir()
	p, cfg := openFilePool(t, 192<<20)
	for _, v := range []struct {
		name string
		size uint64
	}{{"vol-enc", 64 << 20}, {"gap", 64 << 20}, {"vol-encblk", 48 << 20}, {"vol-plain", 32 << 20}} {
		if _, err := p.CreateVolume(v.name, v.size, pool.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", v.name, err)
		}
	}
	if err := p.DeleteVolume("gap"); err != nil { // room for vol-enc to grow in place
		t.Fatal(err)
	}
	_, _, att := guestAttacher(t, p, dir, kernel.Options{Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	defer att.Close(context.Background())
	ns := guestCryptNodeServer(t, att)
	ctx := context.Background()
	enc := map[string]string{ParamEncrypted: "true"}
	key, wrong := map[string]string{SecretKeyField: "correct horse battery staple"}, map[string]string{SecretKeyField: "tr0ub4dor&3"}
	step := func(name string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	stage := func(id, staging string, c *csi.VolumeCapability, vc, secrets map[string]string) error {
		start := time.Now()
		_, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: c, VolumeContext: vc, Secrets: secrets})
		t.Logf("stage %s: %v (%s)", id, err, time.Since(start).Round(time.Millisecond))
		return err
	}
	unstage := func(id, staging string) error {
		_, err := ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	}
	fill := func(path string, block []byte, copies int) error {
		return writeSync(path, bytes.Repeat(block, copies))
	}

	// Control: written in the clear, the scan finds the pattern (on both copies).
	plain := plainPattern("RAID10-CSI PLAINTEXT CONTROL BLOCK")
	stPlain := filepath.Join(dir, "st-plain")
	step("stage plain", stage("vol-plain", stPlain, mountCap("ext4"), nil, nil))
	step("write plain", fill(filepath.Join(stPlain, "f"), plain, 1024))
	step("unstage plain", unstage("vol-plain", stPlain))
	if n := onDisks(t, cfg, plain[:64]); n < 2*1024*(4096/64) {
		t.Fatalf("control: the plaintext marker is found %d times on the disks, want at least %d (two copies)", n, 2*1024*(4096/64))
	}

	// Encrypted Filesystem: a blank device gets a header, ext4 goes on the mapping.
	secret := plainPattern("RAID10-CSI SECRET FILESYSTEM BLOCK")
	stEnc := filepath.Join(dir, "st-enc")
	missing := stage("vol-enc", stEnc, mountCap("ext4"), enc, nil)
	if status.Code(toStatus(missing)) != codes.InvalidArgument || !strings.Contains(missing.Error(), "node-stage-secret-name") {
		t.Fatalf("stage without a secret: %v; want InvalidArgument naming the node-stage secret", missing)
	}
	dev := att.Device("vol-enc")
	if fs := blkid(t, dev); fs != "" {
		t.Fatalf("%s holds %q after a stage without a key, want it blank", dev, fs)
	}
	step("stage encrypted", stage("vol-enc", stEnc, mountCap("ext4"), enc, key))
	if fs := blkid(t, dev); fs != "crypto_LUKS" {
		t.Fatalf("%s holds %q, want crypto_LUKS", dev, fs)
	}
	mapper := ns.cryptsetup().Path(crypt.MapperName("vol-enc"))
	if fs := blkid(t, mapper); fs != "ext4" {
		t.Fatalf("%s holds %q, want ext4", mapper, fs)
	}
	step("write secret", fill(filepath.Join(stEnc, "f"), secret, 2048))
	step("unstage encrypted", unstage("vol-enc", stEnc))
	if _, err := os.Stat(mapper); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after unstage: %v, want it gone", mapper, err)
	}
	if n := onDisks(t, cfg, secret[:64]); n != 0 {
		t.Fatalf("the encrypted volume's plaintext marker is found %d times on the raw disks", n)
	}

	// A wrong key: FailedPrecondition naming the volume and the wrong key; the header is
	// unchanged and nothing was formatted.
	dev, err := att.Attach(ctx, "vol-enc")
	step("attach", err)
	before := headSum(t, dev, luks2HeaderBytes)
	bad := stage("vol-enc", stEnc, mountCap("ext4"), enc, wrong)
	if status.Code(toStatus(bad)) != codes.FailedPrecondition || !strings.Contains(bad.Error(), "wrong key") || !strings.Contains(bad.Error(), `"vol-enc"`) {
		t.Fatalf("stage with a wrong key: %v; want FailedPrecondition naming the volume and the wrong key", bad)
	}
	if headSum(t, dev, luks2HeaderBytes) != before {
		t.Fatal("the LUKS header changed after a stage with a wrong key")
	}
	// The right key: the data reads back.
	step("re-stage encrypted", stage("vol-enc", stEnc, mountCap("ext4"), enc, key))
	got, err := os.ReadFile(filepath.Join(stEnc, "f"))
	if err != nil || !bytes.Equal(got, bytes.Repeat(secret, 2048)) {
		t.Fatalf("read back through the re-opened mapping: %d bytes, %v", len(got), err)
	}

	// A repeated stage, and one by a fresh node service (a restarted plugin, whose
	// predecessor handed the device over): the active mapping is found over the same device
	// (cryptsetup status) and kept.
	step("repeated stage", stage("vol-enc", stEnc, mountCap("ext4"), enc, key))
	ns2, err := NewNodeServer(NodeConfig{NodeID: "vm-node", Attacher: att, Mounter: mount.New(""), Exec: utilexec.New()})
	step("second node service", err)
	_, err = ns2.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-enc", StagingTargetPath: stEnc,
		VolumeCapability: mountCap("ext4"), VolumeContext: enc, Secrets: key})
	step("stage by a fresh node service", err)
	if backing, err := ns2.cryptsetup().Backing(ctx, crypt.MapperName("vol-enc")); err != nil || backing != dev {
		t.Fatalf("the mapping is over %q (%v), want %s", backing, err, dev)
	}

	// Online expansion: the pool grows the volume, NodeExpandVolume the device, the mapping
	// and ext4.
	df0 := dfSize(t, stEnc)
	_, err = p.ExpandVolume("vol-enc", 128<<20)
	step("pool expand", err)
	_, err = ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-enc", VolumePath: stEnc, StagingTargetPath: stEnc,
		VolumeCapability: mountCap("ext4"), CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20}})
	step("NodeExpandVolume", err)
	if got := vm.BlockSize(t, mapper); got != 128<<20-luks2HeaderBytes {
		t.Fatalf("%s has %d bytes after expansion, want %d", mapper, got, 128<<20-luks2HeaderBytes)
	}
	if df1 := dfSize(t, stEnc); df1 < df0+56<<20 {
		t.Fatalf("filesystem %d -> %d bytes: not grown by 64 MiB", df0, df1)
	}
	step("unstage encrypted again", unstage("vol-enc", stEnc))
	cryptRotate(t, stage, unstage, stEnc, enc, key, bytes.Repeat(secret, 2048))

	// The control volume holds ext4 without a LUKS header: refused, not formatted.
	refused := stage("vol-plain", stPlain, mountCap("ext4"), enc, key)
	if status.Code(toStatus(refused)) != codes.FailedPrecondition || !strings.Contains(refused.Error(), "not blank") {
		t.Fatalf("stage of a device with data as encrypted: %v; want FailedPrecondition: not blank", refused)
	}
	if fs := blkid(t, att.Device("vol-plain")); fs != "ext4" {
		t.Fatalf("the refused device holds %q, want its ext4 still", fs)
	}
	step("detach plain", att.Detach(ctx, "vol-plain"))
	step("delete plain", p.DeleteVolume("vol-plain")) // room for cryptCopies

	cryptBlock(t, ns, cfg, enc, key)
	cryptCopies(t, ns, p, cfg, att, enc, key, wrong)
}

// cryptRotate: a node-stage Secret with a new key and the old one as previousKey rotates
// vol-enc's header on the real /dev/nbdX at its stage; dm-crypt opens it with the new key
// and want, the file written before, reads back (the volume key stayed); the old key alone
// is then refused. (A stage with nothing left to rotate: TestRotateRealCryptsetup.)
func cryptRotate(t *testing.T, stage func(id, st string, c *csi.VolumeCapability, vc, secrets map[string]string) error,
	unstage func(id, st string) error, stEnc string, enc, key map[string]string, want []byte) {
	t.Helper()
	rotated := map[string]string{SecretKeyField: "a new passphrase after rotation", SecretPreviousKeyField: key[SecretKeyField]}
	if err := stage("vol-enc", stEnc, mountCap("ext4"), enc, rotated); err != nil {
		t.Fatalf("stage with a rotation: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(stEnc, "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back after the rotation: %d bytes, %v", len(got), err)
	}
	if err := unstage("vol-enc", stEnc); err != nil {
		t.Fatal(err)
	}
	bad := stage("vol-enc", stEnc, mountCap("ext4"), enc, key)
	if status.Code(toStatus(bad)) != codes.FailedPrecondition || !strings.Contains(bad.Error(), "wrong key") {
		t.Fatalf("stage with the rotated-away key: %v; want FailedPrecondition: wrong key", bad)
	}
	if err := unstage("vol-enc", stEnc); err != nil { // the failed stage left the device attached
		t.Fatal(err)
	}
}

// cryptBlock: an encrypted Block volume publishes the mapping; what a pod writes there is
// on no disk in the clear and reads back after a re-stage.
func cryptBlock(t *testing.T, ns *NodeServer, cfg pool.Config, enc, key map[string]string) {
	ctx := context.Background()
	dir := t.TempDir()
	st, tg := filepath.Join(dir, "st-blk"), filepath.Join(dir, "pod", "dev")
	secret := bytes.Repeat(plainPattern("RAID10-CSI SECRET BLOCK-MODE BLOCK"), 1024)
	stage := func() {
		t.Helper()
		if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-encblk", StagingTargetPath: st,
			VolumeCapability: blockCap(), VolumeContext: enc, Secrets: key}); err != nil {
			t.Fatalf("stage block: %v", err)
		}
		if _, err := ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-encblk", StagingTargetPath: st,
			TargetPath: tg, VolumeCapability: blockCap(), VolumeContext: enc}); err != nil {
			t.Fatalf("publish block: %v", err)
		}
	}
	unstage := func() {
		t.Helper()
		if _, err := ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-encblk", TargetPath: tg}); err != nil {
			t.Fatalf("unpublish block: %v", err)
		}
		if _, err := ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-encblk", StagingTargetPath: st}); err != nil {
			t.Fatalf("unstage block: %v", err)
		}
	}
	stage()
	if got := vm.BlockSize(t, tg); got != 48<<20-luks2HeaderBytes {
		t.Fatalf("published block device has %d bytes, want the mapping's %d", got, 48<<20-luks2HeaderBytes)
	}
	if err := writeSync(tg, secret); err != nil {
		t.Fatalf("write the block device: %v", err)
	}
	unstage()
	if n := onDisks(t, cfg, secret[:64]); n != 0 {
		t.Fatalf("the encrypted block volume's plaintext marker is found %d times on the raw disks", n)
	}
	stage()
	f, err := os.Open(tg)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(secret))
	_, err = io.ReadFull(f, got)
	f.Close()
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("read back from the re-staged block volume: %v", err)
	}
	unstage()
}
