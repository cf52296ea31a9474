package driver

import (
	"bytes"
	"context"
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

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// cryptCopies: a snapshot, a restore of it and a clone of an encrypted Block volume holding
// a known pattern (vol-encblk, written by cryptBlock) keep their source's key. Once every
// copy is complete the pattern is on no member disk read raw (the snapshot's and the
// copies' extents hold the source's ciphertext); the clone and the restore open with the
// source's key and read the pattern back; a wrong key is refused on the clone, whose header
// stays byte for byte.
func cryptCopies(t *testing.T, ns *NodeServer, p *pool.Pool, cfg pool.Config, att *attach.PoolAttacher, enc, key, wrong map[string]string) {
	ctx := context.Background()
	secret := bytes.Repeat(plainPattern("RAID10-CSI SECRET BLOCK-MODE BLOCK"), 1024) // cryptBlock's
	if _, err := p.CreateSnapshot("snap-encblk", "vol-encblk"); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	waitCopied(t, func() (bool, error) {
		si, err := p.Snapshot("snap-encblk")
		return si.Ready, err
	}, "snap-encblk")
	for name, src := range map[string]pool.Source{"vol-restored": {Snapshot: "snap-encblk"}, "vol-clone": {Volume: "vol-encblk"}} {
		if _, err := p.CreateVolume(name, 48<<20, pool.CreateOptions{Source: &src}); err != nil {
			t.Fatalf("create %s from %+v: %v", name, src, err)
		}
		waitCopied(t, func() (bool, error) {
			vi, err := p.Volume(name)
			return vi.Hydrated, err
		}, name)
	}
	if n := onDisks(t, cfg, secret[:64]); n != 0 {
		t.Fatalf("with a snapshot, a restore and a clone of the encrypted volume, its plaintext marker is found %d times on the raw disks", n)
	}

	dir := t.TempDir()
	stage := func(id string, secrets map[string]string) (string, error) {
		st, tg := filepath.Join(dir, "st-"+id), filepath.Join(dir, "pod-"+id, "dev")
		if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: st,
			VolumeCapability: blockCap(), VolumeContext: enc, Secrets: secrets}); err != nil {
			return "", err
		}
		_, err := ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: st,
			TargetPath: tg, VolumeCapability: blockCap(), VolumeContext: enc})
		return tg, err
	}
	unstage := func(id string) {
		t.Helper()
		st, tg := filepath.Join(dir, "st-"+id), filepath.Join(dir, "pod-"+id, "dev")
		if _, err := ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tg}); err != nil {
			t.Fatalf("unpublish %s: %v", id, err)
		}
		if _, err := ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: st}); err != nil {
			t.Fatalf("unstage %s: %v", id, err)
		}
	}

	// A wrong key on the clone: refused, its header unchanged.
	dev, err := att.Attach(ctx, "vol-clone")
	if err != nil {
		t.Fatal(err)
	}
	before := headSum(t, dev, luks2HeaderBytes)
	_, bad := stage("vol-clone", wrong)
	if status.Code(toStatus(bad)) != codes.FailedPrecondition || !strings.Contains(fmt.Sprint(bad), "wrong key") {
		t.Fatalf("stage of the clone with a wrong key: %v; want FailedPrecondition: wrong key", bad)
	}
	if headSum(t, dev, luks2HeaderBytes) != before {
		t.Fatal("the clone's LUKS header changed after a stage with a wrong key")
	}
	// The source's key opens the clone and the restore; both hold the pattern.
	for _, id := range []string{"vol-clone", "vol-restored"} {
		tg, err := stage(id, key)
		if err != nil {
			t.Fatalf("stage %s with its source's key: %v", id, err)
		}
		if got := readHead(t, tg, len(secret)); !bytes.Equal(got, secret) {
			t.Fatalf("%s through its mapping: not the source's pattern", id)
		}
		unstage(id)
	}
}

// waitCopied polls done until it reports true (a snapshot ready, a copy hydrated).
func waitCopied(t *testing.T, done func() (bool, error), name string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, err := done()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: copy not complete after 2 minutes", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// readHead reads the first n bytes of the block device at path.
func readHead(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return b
}
