package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// faultDiskSize is the size of each disk of TestRestartFaultsInGuest.
const faultDiskSize = 128 << 20

// newFaultDisks creates n disks name0.. (device-mapper devices over loop devices over
// sparse files in dir, whose tables a test swaps under the running plugin, as a disk that
// dies would appear); they are removed when the test ends, and their files too unless the
// test failed (room in the guest's tmpfs for the tests after this one).
func newFaultDisks(t *testing.T, dir, name string, n int) []vm.DMDisk {
	t.Helper()
	files := vm.SparseFiles(t, dir, name, n, faultDiskSize)
	t.Cleanup(func() {
		if !t.Failed() {
			for _, f := range files {
				_ = os.Remove(f)
			}
		}
	})
	return vm.NewDMDisks(t, name, vm.LoopDevices(t, files), faultDiskSize)
}

// TestRestartFaultsInGuest restarts the plugin while disks fail and rebuild, the faults of
// a node's worst hour overlapping its restarts, with fio writing and verifying through ext4
// every time (a 96 MiB volume over four dm devices, a fifth as the replacement; resync and
// recovery limited to 2 MiB/s, or 512 KiB/s where a recovery must outlast a restart, so
// that each phase spans the restart it must overlap: the plugin reads its configuration's
// rate when it starts):
//
//  1. a disk dies just before a graceful restart: the old process meets the errors while
//     it hands the devices over, the new one opens the pool with a disk that answers
//     nothing (refused as unreadable, its member Missing) and resyncs what the unclean
//     stop left dirty;
//  2. the dead member is replaced (by its UUID: its path names no member now, and the pool
//     records the new disk itself) and the plugin restarts gracefully while the resync
//     runs and the recovery waits for it (or, when the resync ended first, while the
//     recovery runs);
//  3. the plugin is killed while the recovery runs (its successor at full speed);
//  4. the recovery ends Healthy, a check scrub finds no mismatch, and the filesystem checks
//     clean.
//
// Every round must end with no fio error and a passing verification, and a graceful one
// must hand over without waiting for the kernel's request timeout.
func TestRestartFaultsInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestRestartVM")
	dir := "/var/tmp/restart-faults" // not under t.TempDir: the plugin's logs stay readable after a failure
	disks := newFaultDisks(t, dir, "rf", 5)
	var paths []string
	for _, d := range disks[:4] {
		paths = append(paths, d.Path())
	}
	cfg := pool.Config{RebuildRateMax: 2 << 20}
	rig := newRestartRig(t, dir, cfg, paths, "--frontend=nbd")
	id, staging, dev := rig.stage("ext4", "vol-faults", 96<<20)
	t.Cleanup(func() {
		// A failed run leaves nothing mounted on the device for the tests after it.
		_ = exec.Command("umount", staging).Run()
		if t.Failed() {
			rig.grepLogs("raid10:", "pool:", "Scrub", "ecover", "esync", "ebuild")
		}
	})
	file := filepath.Join(staging, "fio.dat")

	status := func() pool.VolumeInfo {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := admin.Dial(ctx, filepath.Join(dir, "state", "admin.sock"))
		if err != nil {
			t.Fatalf("admin socket: %v", err)
		}
		defer c.Close()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		for _, v := range st.Volumes {
			if v.Name == id {
				return v
			}
		}
		t.Fatalf("volume %s not in the pool's status: %+v", id, st.Volumes)
		return pool.VolumeInfo{}
	}
	describe := func(v pool.VolumeInfo) string {
		s := fmt.Sprintf("%s %d/%d", v.Health, v.InSync, len(v.Members))
		if v.Sync != nil {
			s += fmt.Sprintf(", %s %.1f%%", v.Sync.Kind, v.Sync.Percent)
		}
		return s
	}
	waitHealth := func(want pool.Health, within time.Duration) pool.VolumeInfo {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			v := status()
			if v.Health == want {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("volume %s is %s, not %s, after %s", id, describe(v), want, within)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	// 1. A disk dies at a graceful restart.
	r := rig.restartUnderFio(file, dev, "graceful", func() { disks[1].Swap(t, disks[1].Dead()) })
	rig.checkRound("disk dead at a graceful restart", r, "nbd")
	v := waitHealth(pool.Degraded, 2*time.Minute)
	t.Logf("after the restart: %s", describe(v))

	// 2. The dead member replaced; a graceful restart during the resync, the recovery waiting.
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := admin.Dial(ctx, filepath.Join(dir, "state", "admin.sock"))
		if err != nil {
			t.Fatalf("admin socket: %v", err)
		}
		defer c.Close()
		// The dead disk's label cannot be read, so the pool refused its path and lists the
		// member it was as Missing under its UUID; naming the refused path is an error.
		if _, err := c.ReplaceDisk(ctx, disks[1].Path(), pool.DiskConfig{Path: disks[4].Path()}); !errors.Is(err, pool.ErrFailedPrecondition) {
			t.Fatalf("replace of the refused path %s: %v, want FailedPrecondition", disks[1].Path(), err)
		}
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		for _, d := range st.Disks {
			t.Logf("disk %s %s %s", d.UUID, d.Path, d.Status)
			if d.Status == pool.StatusMissing {
				missing = append(missing, d.UUID)
			}
		}
		if len(missing) != 1 {
			t.Fatalf("missing disks %v, want the dead one", missing)
		}
		if _, err := c.ReplaceDisk(ctx, missing[0], pool.DiskConfig{Path: disks[4].Path()}); err != nil {
			t.Fatalf("replace %s with %s: %v", missing[0], disks[4].Path(), err)
		}
		// The configured list stays as it is: the pool records the new disk in the state
		// directory (pool.Config.DisksFile), so that the next process opens it.
		recorded, err := os.ReadFile(filepath.Join(dir, "state", pool.DisksFileName))
		if err != nil || !strings.Contains(string(recorded), `"`+disks[4].Path()+`"`) {
			t.Fatalf("%s does not record the replacement %s: %v\n%s", pool.DisksFileName, disks[4].Path(), err, recorded)
		}
	}()
	syncing := func(kind string) bool {
		v := status()
		return v.Sync != nil && v.Sync.Kind == kind
	}
	r = rig.restartUnderFio(file, dev, "graceful", func() {
		v := status()
		t.Logf("before the graceful restart: %s", describe(v))
		switch {
		case syncing("resync"):
			// The stop is unclean while a resync is pending: the successor resyncs first.
		case v.Health == pool.Rebuilding && syncing("recovery"):
			// The resync ended first: the successor resumes the recovery, slowly enough that
			// the kill below meets it even when this round's fio takes minutes on a loaded
			// machine (no resync is left to slow down: this restart is clean).
			slow := cfg
			slow.RebuildRateMax = 32 << 10
			writePoolConfig(t, dir, slow, paths)
		default:
			t.Fatalf("the volume is %s before the graceful restart: this round tests a restart during the resync or the recovery", describe(v))
		}
	})
	rig.checkRound("graceful restart during the resync, a recovery waiting", r, "nbd")
	t.Logf("after the graceful restart: %s", describe(status()))

	// 3. Killed during the recovery (a resync the unclean stops left runs before it, as md
	// runs a resync before a recovery).
	for deadline := time.Now().Add(5 * time.Minute); !syncing("recovery"); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("volume %s is %s, not rebuilding, 5 minutes after the replacement", id, describe(status()))
		}
	}
	r = rig.restartUnderFio(file, dev, "kill", func() {
		v := status()
		t.Logf("before the kill: %s", describe(v))
		if v.Health != pool.Rebuilding || !syncing("recovery") {
			t.Fatalf("the volume is %s before the kill: this round tests a kill during the recovery", describe(v))
		}
		fast := cfg
		fast.RebuildRateMax = 0 // the engine's default: the rest needs no more waiting
		writePoolConfig(t, dir, fast, paths)
	})
	rig.checkRound("kill during the recovery", r, "nbd")
	t.Logf("after the kill: %s", describe(status()))

	// 4. Healthy, no mismatch, a clean filesystem.
	start := time.Now()
	waitHealth(pool.Healthy, 5*time.Minute)
	t.Logf("rebuild done %s after the last restart", time.Since(start).Round(time.Second))
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, err := admin.Dial(ctx, filepath.Join(dir, "state", "admin.sock"))
		if err != nil {
			t.Fatalf("admin socket: %v", err)
		}
		defer c.Close()
		if _, err := c.StartScrub(ctx, id, pool.ScrubCheck); err != nil {
			t.Fatalf("scrub: %v", err)
		}
	}()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		v := status()
		if s := v.Scrub; s != nil && s.State != pool.ScrubRunning {
			t.Logf("scrub: %s, %d mismatches, %d lost", s.State, s.Mismatches, s.Lost)
			if s.State != pool.ScrubDone || s.Mismatches != 0 || s.Lost != 0 {
				t.Fatalf("scrub after the rebuild: %+v", *s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrub still running after 5 minutes: %+v", v.Scrub)
		}
	}
	rig.unstage(id, staging, dev, "ext4")
	if _, err := csi.NewControllerClient(rig.conn).DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	rig.stop()
}
