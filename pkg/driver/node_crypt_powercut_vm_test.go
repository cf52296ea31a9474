package driver

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// powerCutDirEnv names the host directory the power-cut guests share: the writer's
// acknowledged record count goes there.
const powerCutDirEnv = "RAID10_POWERCUT_DIR"

// powerCutAcks is how many fsync-acknowledged records the host waits for before the cut.
const powerCutAcks = 60

// TestCryptPowerCutVM is a power cut under an encrypted volume (issue 27): boot 1 stages an
// encrypted ext4 volume over /dev/nbdX on a pool of four virtio disks and appends
// checksummed 4 KiB records, each fsynced before its number is written to a file the host
// shares; after powerCutAcks the host kills QEMU (SIGKILL: no shutdown, nothing flushed that
// was not). Boot 2 opens the pool on the same disk files, stages the volume with the key
// (LUKS2 opens, ext4 replays its journal) and finds every acknowledged record intact, in
// order.
func TestCryptPowerCutVM(t *testing.T) {
	vm.HostHalf(t)
	vm.Require(t)
	files := vm.SparseFiles(t, t.TempDir(), "disk", 4, 96<<20)
	var disks []vm.Disk
	for i, f := range files {
		disks = append(disks, vm.Disk{File: f, Serial: fmt.Sprintf("pc%d", i)})
	}
	share := t.TempDir()
	opts := vm.Options{Timeout: 5 * time.Minute, Memory: 1536, Disks: disks, Writable: []string{share},
		Modules: append(append([]string{}, vm.DefaultModules...), "virtio_blk", "dm_mod", "dm_crypt", "xts", "algif_skcipher"),
		Env:     []string{powerCutDirEnv + "=" + share}}

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	bin, dir, cleanup, err := vm.BuildGoTest(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	boot1 := opts
	boot1.Dir = dir
	boot1.Writable = append(boot1.Writable, filepath.Dir(bin))
	boot1.Env = append(boot1.Env, vm.InGuestEnv+"=1")
	var out strings.Builder
	boot1.Stdout = &out
	cut, cutNow := context.WithCancel(ctx)
	defer cutNow()
	acked := make(chan int, 1)
	go func() {
		for cut.Err() == nil {
			if n := readAcks(share); n >= powerCutAcks {
				cutNow() // the power cut: QEMU's process group gets SIGKILL
				acked <- n
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	res, err := vm.Run(cut, boot1, "exec "+vm.ShellJoin(bin, "-test.run=^TestCryptPowerCutWriteInGuest$", "-test.v"))
	select {
	case n := <-acked:
		t.Logf("boot 1: power cut after %d acknowledged records (%v)", n, err)
	default:
		tail := ""
		if res != nil {
			tail = res.ConsoleTail(30)
		}
		t.Fatalf("boot 1 ended before %d acknowledged records (%d): %v\n%s\n%s", powerCutAcks, readAcks(share), err, out.String(), tail)
	}
	// The writer went on between the host's read and the kill: the verify needs the count
	// at the cut, which is at least what the host saw.
	vm.RunGoTestOpts(t, opts, ".", "-test.run=^TestCryptPowerCutVerifyInGuest$", "-test.v", "-test.timeout=4m")
}

// readAcks is the writer's last acknowledged record count in dir (0 if none yet).
func readAcks(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "acks"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// powerCutNode opens the pool on the guest's four virtio disks and the node service over it
// (the cheap key derivation of the VM tests).
func powerCutNode(t *testing.T, create bool) (*NodeServer, string) {
	t.Helper()
	p, _ := openPoolOn(t, []string{"/dev/vda", "/dev/vdb", "/dev/vdc", "/dev/vdd"})
	if create {
		if _, err := p.CreateVolume("vol-pc", 48<<20, pool.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	_, _, att := guestAttacher(t, p, dir, kernel.Options{Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	t.Cleanup(func() { att.Close(context.Background()) })
	ns := guestCryptNodeServer(t, att)
	staging := filepath.Join(dir, "staging")
	if _, err := ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: "vol-pc", StagingTargetPath: staging,
		VolumeCapability: mountCap("ext4"), VolumeContext: map[string]string{ParamEncrypted: "true"},
		Secrets: map[string]string{SecretKeyField: "correct horse battery staple"}}); err != nil {
		t.Fatalf("stage: %v", err)
	}
	return ns, staging
}

// powerCutRecord is record i: its number, a CRC-32 of the rest, and a payload derived from i.
func powerCutRecord(i int) []byte {
	b := make([]byte, 4096)
	binary.LittleEndian.PutUint64(b[8:], uint64(i))
	for o := 16; o < len(b); o += 8 {
		binary.LittleEndian.PutUint64(b[o:], uint64(i)*0x9E3779B97F4A7C15^uint64(o))
	}
	binary.LittleEndian.PutUint32(b[0:], crc32.ChecksumIEEE(b[8:]))
	return b
}

// TestCryptPowerCutWriteInGuest is boot 1 of TestCryptPowerCutVM: it appends records until
// the host cuts the power, writing the count after each record's fsync.
func TestCryptPowerCutWriteInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestCryptPowerCutVM")
	share := os.Getenv(powerCutDirEnv)
	_, staging := powerCutNode(t, true)
	f, err := os.OpenFile(filepath.Join(staging, "records"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		if _, err := f.Write(powerCutRecord(i)); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(share, "acks.tmp")
		if err := os.WriteFile(tmp, []byte(strconv.Itoa(i+1)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(share, "acks")); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("no power cut within 3 minutes")
}

// TestCryptPowerCutVerifyInGuest is boot 2 of TestCryptPowerCutVM: every acknowledged record
// reads back intact.
func TestCryptPowerCutVerifyInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestCryptPowerCutVM")
	acks := readAcks(os.Getenv(powerCutDirEnv))
	if acks < powerCutAcks {
		t.Fatalf("the writer acknowledged %d records, want at least %d", acks, powerCutAcks)
	}
	ns, staging := powerCutNode(t, false)
	b, err := os.ReadFile(filepath.Join(staging, "records"))
	if err != nil {
		t.Fatal(err)
	}
	n := len(b) / 4096
	if n < acks {
		t.Fatalf("%d whole records after the power cut, %d were acknowledged", n, acks)
	}
	for i := 0; i < acks; i++ {
		rec := b[i*4096 : (i+1)*4096]
		want := powerCutRecord(i)
		if string(rec) != string(want) {
			t.Fatalf("record %d of %d acknowledged differs after the power cut (number %d)", i, acks, binary.LittleEndian.Uint64(rec[8:]))
		}
	}
	t.Logf("after the power cut: %d acknowledged records intact, %d records in the file (%d bytes)", acks, n, len(b))
	if _, err := ns.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: "vol-pc", StagingTargetPath: staging}); err != nil {
		t.Fatalf("unstage: %v", err)
	}
}
