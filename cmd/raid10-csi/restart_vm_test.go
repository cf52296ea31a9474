package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// runMainEnv makes the test binary run main() instead of the tests: the plugin process of
// TestRestartInGuest, which kills and restarts it.
const runMainEnv = "RAID10_CSI_TEST_RUN_MAIN"

// restartLongEnv, set to 1, runs TestRestartVM with 20 graceful restarts and 20 kills per
// filesystem (the measurement of docs/design.md) instead of the short version of make test.
const restartLongEnv = "RAID10_RESTART_LONG"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Args = append([]string{"raid10-csi"}, strings.Fields(os.Getenv(runMainEnv+"_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRestartVM runs TestRestartInGuest and TestRestartFaultsInGuest in the VM: restarts of
// the plugin under fio, alone and overlapping a disk that dies and its rebuild.
func TestRestartVM(t *testing.T) {
	vm.HostHalf(t)
	// The encrypted rounds (ext4+crypt) run in the long mode and by hand: in make test they
	// added about 110 s of emulated dm-crypt beside the kubelet story, whose node plugin then
	// exited 1 a minute after its surge handover in a clean-clone CI run (session 12; the
	// story alone passed). They passed once in the default rounds: graceful stall 0.6 s, kill
	// 10.2 s, 0 errors.
	timeout, rounds := 14*time.Minute, "ext4:1:1:0:1,xfs:1:1"
	if os.Getenv(restartLongEnv) == "1" {
		timeout, rounds = 86*time.Minute, "ext4:20:20:5:10,xfs:20:20:5:10,ext4+crypt:5:5"
	}
	if r := os.Getenv("RAID10_RESTART_ROUNDS"); r != "" { // by hand: other rounds
		rounds = r
	}
	// dm_crypt, xts, algif_skcipher: the encrypted volume (ext4+crypt) of TestRestartInGuest.
	res := vm.RunGoTestOpts(t, vm.Options{Timeout: timeout, Memory: 2048, Env: []string{"RAID10_RESTART_ROUNDS=" + rounds},
		Modules: append(append([]string{}, vm.DefaultModules...), "dm_mod", "dm_crypt", "xts", "algif_skcipher"),
		Tests:   []string{"TestRestartInGuest", "TestRestartFaultsInGuest"}},
		".", "-test.run=^TestRestart(Faults)?InGuest$", "-test.v", "-test.timeout="+(timeout-90*time.Second).String())
	t.Logf("VM run: boot %s, total %s", res.Boot.Round(time.Second), res.Duration.Round(time.Second))
}

// restartFrontendEnv names the plugin's --frontend in TestRestartInGuest (default nbd).
const restartFrontendEnv = "RAID10_RESTART_FRONTEND"

// TestRestartUblkVM runs TestRestartInGuest with --frontend=ublk in the 6.12 VM (ublk_drv):
// one graceful restart and one kill of the plugin under fio verification on ext4 over
// /dev/ublkbN; the new process recovers the device (the kernel kept its I/O queued).
func TestRestartUblkVM(t *testing.T) {
	vm.HostHalf(t)
	res := vm.RunGoTestOpts(t, vm.Options{Timeout: 6 * time.Minute, Memory: 2048,
		KernelSeries: vm.UblkKernelSeries, Modules: append(append([]string{}, vm.DefaultModules...), "ublk_drv"),
		Env: []string{"RAID10_RESTART_ROUNDS=ext4:1:1", restartFrontendEnv + "=ublk"}},
		".", "-test.run=^TestRestartInGuest$", "-test.v", "-test.timeout=5m")
	t.Logf("VM run: boot %s, total %s", res.Boot.Round(time.Second), res.Duration.Round(time.Second))
}

// round is the outcome of one restart under fio.
type round struct {
	kind    string        // graceful or kill
	stall   time.Duration // fio's largest completion latency
	served  time.Duration // from the signal to the new process answering on its CSI socket
	errors  int
	verify  bool
	handed  bool          // the logs show a handover (graceful)
	old     *pluginProc   // the process restarted
	ios     int           // writes fio completed
	mean    time.Duration // their mean completion latency
	fioTail string
}

// TestRestartInGuest starts raid10-csi --mode=all as a process of its own on four file disks,
// creates and stages a mounted volume per filesystem, and restarts the plugin while fio writes
// with verification through the filesystem: graceful restarts (SIGTERM; once the process has
// ended a new one starts and takes the devices over) and kills (SIGKILL, then a new process,
// which reattaches), and drains (SIGTERM with no holder: the connections are drained and
// closed, the kernel requeues what was in flight at its request timeout; the behaviour
// without the handover, for comparison), with a holder process (--mode=holder) beside them that keeps the devices
// between a plugin that stops and the next one. For each restart it records fio's largest completion latency (the stall),
// its errors and its verification; every round must have no error and a passing
// verification, a graceful one must have handed over and stalled less than the kernel's
// request timeout (no request waited for it), and the filesystem must check clean at the end.
// Overlaps start the new process while the old one still serves (a surge update): it waits,
// and takes the devices from the old one directly when that one is told to stop. RAID10_RESTART_ROUNDS is
// "fs:graceful:kills[:drains[:overlaps]],..."; an fs of "ext4+crypt" is an encrypted
// volume (encrypted: "true", the node-stage secret's key): fio runs on ext4 over its
// dm-crypt mapping, which stays open over the served device across the restarts.
func TestRestartInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestRestartVM")
	spec := os.Getenv("RAID10_RESTART_ROUNDS")
	if spec == "" {
		spec = "ext4:1:1"
	}
	dir := "/var/tmp/restart-test" // not under t.TempDir: the plugin's logs stay readable after a failure
	_ = os.RemoveAll(dir)
	disks := vm.SparseFiles(t, dir, "disk", 4, 256<<20)
	frontend := os.Getenv(restartFrontendEnv)
	if frontend == "" {
		frontend = "nbd"
	}
	// The encrypted volume's header gets the cheap key derivation (--crypt-*): argon2id at
	// cryptsetup's defaults costs seconds of emulated CPU.
	rig := newRestartRig(t, dir, pool.Config{}, disks, "--frontend="+frontend,
		"--crypt-pbkdf=pbkdf2", "--crypt-pbkdf-force-iterations=1000")
	ctx := context.Background()
	ctrl := csi.NewControllerClient(rig.conn)

	results := map[string][]round{}
	var order []string
	for _, part := range strings.Split(spec, ",") {
		f := strings.Split(part, ":")
		if len(f) < 3 {
			t.Fatalf("bad RAID10_RESTART_ROUNDS part %q", part)
		}
		label := f[0]
		fs, crypted := strings.CutSuffix(label, "+crypt")
		graceful, _ := strconv.Atoi(f[1])
		kills, _ := strconv.Atoi(f[2])
		drains, overlaps := 0, 0
		if len(f) > 3 {
			drains, _ = strconv.Atoi(f[3])
		}
		if len(f) > 4 {
			overlaps, _ = strconv.Atoi(f[4])
		}
		var params, secrets map[string]string
		want := map[string]string{"nbd": "/dev/nbd", "ublk": "/dev/ublkb"}[frontend]
		if crypted {
			params, secrets = map[string]string{"encrypted": "true"}, map[string]string{"key": "restart-test-key"}
			want = "/dev/mapper/raid10-crypt-"
		}
		id, staging, dev := rig.stageWith(fs, "vol-"+strings.ReplaceAll(label, "+", "-"), 320<<20, params, secrets)
		if !strings.HasPrefix(dev, want) {
			t.Fatalf("volume staged on %s, want %s... (--frontend=%s)", dev, want, frontend)
		}

		kinds := make([]string, 0, graceful+kills+drains+overlaps)
		for i := 0; i < max(graceful, kills, drains, overlaps); i++ { // interleaved, so that each sees the same state
			if i < graceful {
				kinds = append(kinds, "graceful")
			}
			if i < kills {
				kinds = append(kinds, "kill")
			}
			if i < drains {
				kinds = append(kinds, "drain")
			}
			if i < overlaps {
				kinds = append(kinds, "overlap")
			}
		}
		for i, kind := range kinds {
			r := rig.restartUnderFio(filepath.Join(staging, "fio.dat"), dev, kind, nil)
			key := label + " " + kind
			if _, ok := results[key]; !ok {
				order = append(order, key)
			}
			results[key] = append(results[key], r)
			// A failed round is reported and the rounds go on, so that the table is complete.
			rig.checkRound(fmt.Sprintf("%s %s round %d", label, kind, i+1), r, frontend)
		}
		rig.unstage(id, staging, dev, fs)
		if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
	}
	t.Log("RESULT | fs kind | restarts | stall p50 | stall max | served again p50 | max | errors | verify |")
	for _, key := range order {
		rs := results[key]
		var stalls, served []time.Duration
		errs, verified := 0, 0
		for _, r := range rs {
			stalls, served = append(stalls, r.stall), append(served, r.served)
			errs += r.errors
			if r.verify {
				verified++
			}
		}
		t.Logf("RESULT | %s | %d | %s | %s | %s | %s | %d | %d/%d passed |", key, len(rs),
			p50(stalls), maxOf(stalls), p50(served), maxOf(served), errs, verified, len(rs))
	}
	rig.stop()
}
