package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
	timeout, rounds := 14*time.Minute, "ext4:1:1:0:1,xfs:1:1"
	if os.Getenv(restartLongEnv) == "1" {
		timeout, rounds = 86*time.Minute, "ext4:20:20:5:10,xfs:20:20:5:10"
	}
	if r := os.Getenv("RAID10_RESTART_ROUNDS"); r != "" { // by hand: other rounds
		rounds = r
	}
	res := vm.RunGoTestOpts(t, vm.Options{Timeout: timeout, Memory: 2048, Env: []string{"RAID10_RESTART_ROUNDS=" + rounds},
		Modules: append(append([]string{}, vm.DefaultModules...), "dm_mod"),
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

// pluginProc is one raid10-csi process of TestRestartInGuest (a plugin or a holder).
type pluginProc struct {
	cmd   *exec.Cmd
	log   string
	start time.Time
	done  chan struct{}
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
// "fs:graceful:kills[:drains[:overlaps]],...".
func TestRestartInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestRestartVM")
	spec := os.Getenv("RAID10_RESTART_ROUNDS")
	if spec == "" {
		spec = "ext4:1:1"
	}
	dir := "/var/tmp/restart-test" // not under t.TempDir: the plugin's logs stay readable after a failure
	_ = os.RemoveAll(dir)
	var disks []string
	for i := range 4 {
		disks = append(disks, sparseFile(t, filepath.Join(dir, fmt.Sprintf("disk%d.img", i)), 256<<20))
	}
	frontend := os.Getenv(restartFrontendEnv)
	if frontend == "" {
		frontend = "nbd"
	}
	rig := newRestartRig(t, dir, pool.Config{}, disks, "--frontend="+frontend)
	ctx := context.Background()
	ctrl := csi.NewControllerClient(rig.conn)

	results := map[string][]round{}
	var order []string
	for _, part := range strings.Split(spec, ",") {
		f := strings.Split(part, ":")
		if len(f) < 3 {
			t.Fatalf("bad RAID10_RESTART_ROUNDS part %q", part)
		}
		fs := f[0]
		graceful, _ := strconv.Atoi(f[1])
		kills, _ := strconv.Atoi(f[2])
		drains, overlaps := 0, 0
		if len(f) > 3 {
			drains, _ = strconv.Atoi(f[3])
		}
		if len(f) > 4 {
			overlaps, _ = strconv.Atoi(f[4])
		}
		id, staging, dev := rig.stage(fs, "vol-"+fs, 320<<20)
		if want := map[string]string{"nbd": "/dev/nbd", "ublk": "/dev/ublkb"}[frontend]; !strings.HasPrefix(dev, want) {
			t.Fatalf("volume staged on %s, want a %sN device (--frontend=%s)", dev, want, frontend)
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
			key := fs + " " + kind
			if _, ok := results[key]; !ok {
				order = append(order, key)
			}
			results[key] = append(results[key], r)
			// A failed round is reported and the rounds go on, so that the table is complete.
			rig.checkRound(fmt.Sprintf("%s %s round %d", fs, kind, i+1), r, frontend)
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

// restartRig runs raid10-csi --mode=all as a process of its own in the guest, with a holder
// process (--mode=holder) beside it that keeps the devices between a plugin that stops and
// the next one, and a CSI client on its socket. Everything lives in dir, which is not under
// t.TempDir so that the plugin's logs stay readable after a failure.
type restartRig struct {
	t       *testing.T
	dir     string
	args    string
	self    string
	plugins int // plugin processes started
	holders int // holder processes started
	holder  *pluginProc
	cur     *pluginProc // the plugin serving now
	conn    *grpc.ClientConn
	ids     csi.IdentityClient
}

// newRestartRig writes the pool's configuration (cfg with disks), starts the holder and a
// plugin with extra flags, and waits until the plugin answers on its CSI socket. The
// processes are stopped when the test ends.
func newRestartRig(t *testing.T, dir string, cfg pool.Config, disks []string, extra ...string) *restartRig {
	t.Helper()
	writePoolConfig(t, dir, cfg, disks)
	sock := filepath.Join(dir, "csi.sock")
	args := append([]string{"--mode=all", "--node-id=vm-node", "--endpoint=unix://" + sock,
		"--pool-config=" + filepath.Join(dir, "pool.json"), "--state-dir=" + filepath.Join(dir, "state"),
		"--metrics-address=", "--handover-wait=0s", "-v=2"}, extra...)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := &restartRig{t: t, dir: dir, args: strings.Join(args, " "), self: self}
	r.holder = r.startHolder()
	t.Cleanup(func() {
		if r.cur != nil {
			_ = r.cur.cmd.Process.Kill()
			<-r.cur.done
		}
		_ = r.holder.cmd.Process.Signal(syscall.SIGTERM)
		<-r.holder.done
	})
	r.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.conn.Close() })
	r.ids = csi.NewIdentityClient(r.conn)
	r.cur = r.startPlugin()
	t.Logf("plugin serving after %s", r.waitServing(r.cur).Round(time.Millisecond))
	return r
}

// writePoolConfig writes dir/pool.json, the plugin's --pool-config: cfg with disks. A plugin
// reads it when it starts.
func writePoolConfig(t *testing.T, dir string, cfg pool.Config, disks []string) {
	t.Helper()
	cfg.Disks = nil
	for _, d := range disks {
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: d})
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "pool.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// sparseFile creates (or empties) a sparse file of size bytes at path, its directory too.
func sparseFile(t *testing.T, path string, size int64) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

func (r *restartRig) dumpLog(p *pluginProc) {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(string(b), "\n")
	r.t.Logf("%s (%v; last lines):\n%s", p.log, p.cmd.ProcessState, strings.Join(lines[max(0, len(lines)-40):], "\n"))
}

// grepLogs logs the lines of every plugin's log that contain one of subs.
func (r *restartRig) grepLogs(subs ...string) {
	for i := 1; i <= r.plugins; i++ {
		b, _ := os.ReadFile(filepath.Join(r.dir, fmt.Sprintf("plugin-%02d.log", i)))
		for _, l := range strings.Split(string(b), "\n") {
			for _, s := range subs {
				if strings.Contains(l, s) {
					r.t.Logf("plugin-%02d: %s", i, l)
					break
				}
			}
		}
	}
}

func (r *restartRig) startProc(name, args string) *pluginProc {
	p := &pluginProc{log: filepath.Join(r.dir, name+".log"), start: time.Now(), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		r.t.Fatal(err)
	}
	p.cmd = exec.Command(r.self)
	p.cmd.Env = append(os.Environ(), runMainEnv+"=1", runMainEnv+"_ARGS="+args)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); f.Close(); close(p.done) }()
	return p
}

func (r *restartRig) startPlugin() *pluginProc {
	r.plugins++
	return r.startProc(fmt.Sprintf("plugin-%02d", r.plugins), r.args)
}

// startHolder starts a holder and returns once it listens (a holder is up before a plugin
// stops).
func (r *restartRig) startHolder() *pluginProc {
	r.holders++
	h := r.startProc(fmt.Sprintf("holder-%02d", r.holders), "--mode=holder --state-dir="+filepath.Join(r.dir, "state")+" -v=2")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", filepath.Join(r.dir, "state", "handover", "holder.sock")); err == nil {
			_ = c.Close()
			return h
		}
		if time.Now().After(deadline) {
			r.dumpLog(h)
			r.t.Fatal("the holder does not listen after a minute")
		}
	}
}

// waitServing waits until the plugin answers a CSI Probe and returns how long after its
// start that was.
func (r *restartRig) waitServing(p *pluginProc) time.Duration {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := r.ids.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil {
			return time.Since(p.start)
		}
		select {
		case <-p.done:
			r.dumpLog(p)
			r.t.Fatalf("plugin exited before serving: %v", p.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			r.dumpLog(p)
			r.t.Fatalf("plugin not serving after 2 minutes: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stage creates a volume of size bytes called name and stages it mounted with fs; it returns the
// volume's ID, the staging path and the device mounted there.
func (r *restartRig) stage(fs, name string, size int64) (id, staging, dev string) {
	r.t.Helper()
	ctx := context.Background()
	capab := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol, err := csi.NewControllerClient(r.conn).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{capab}})
	if err != nil {
		r.t.Fatalf("CreateVolume: %v", err)
	}
	id = vol.GetVolume().GetVolumeId()
	staging = filepath.Join(r.dir, "staging-"+name)
	if _, err := csi.NewNodeClient(r.conn).NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id,
		StagingTargetPath: staging, VolumeCapability: capab}); err != nil {
		r.t.Fatalf("NodeStageVolume: %v", err)
	}
	dev = mountSource(r.t, staging)
	r.t.Logf("%s: volume %s staged on %s", fs, id, dev)
	return id, staging, dev
}

// unstage unmounts the staging path, checks the filesystem clean (e2fsck -fn, xfs_repair -n)
// and unstages the volume.
func (r *restartRig) unstage(id, staging, dev, fs string) {
	r.t.Helper()
	mustRun(r.t, "umount", staging)
	if fs == "xfs" {
		mustRun(r.t, "xfs_repair", "-n", dev)
	} else {
		mustRun(r.t, "e2fsck", "-fn", dev)
	}
	if _, err := csi.NewNodeClient(r.conn).NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		r.t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

// checkRound logs a restart's outcome and fails the test (going on) if fio saw an error or
// its verification failed, or if a graceful or overlapping restart over NBD did not hand
// the devices over or stalled for the kernel's request timeout.
func (r *restartRig) checkRound(name string, rd round, frontend string) {
	r.t.Helper()
	r.t.Logf("%s: stall %s, served again after %s, errors %d, verify %v, handover %v (%d writes, mean %s)",
		name, rd.stall.Round(time.Millisecond), rd.served.Round(time.Millisecond), rd.errors, rd.verify, rd.handed,
		rd.ios, rd.mean.Round(time.Microsecond))
	if rd.errors != 0 || !rd.verify {
		r.dumpLog(r.cur)
		r.t.Errorf("%s: fio failed:\n%s", name, rd.fioTail)
	}
	// Over ublk nothing is handed over: the kernel keeps the device and its queued I/O
	// for the next process, whose recovery the fio check above covers.
	if (rd.kind == "graceful" || rd.kind == "overlap") && frontend == "nbd" && (!rd.handed || rd.stall >= 10*time.Second) {
		r.dumpLog(rd.old)
		r.dumpLog(r.cur)
		r.t.Errorf("%s: handover %v, stall %s (the kernel's request timeout is 10 s)", name, rd.handed, rd.stall)
	}
}

// stop ends the serving plugin with SIGTERM and fails the test if it does not end.
func (r *restartRig) stop() {
	_ = r.cur.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.cur.done:
	case <-time.After(time.Minute):
		r.t.Error("plugin still running a minute after SIGTERM")
	}
	r.cur = nil
}

// restartUnderFio runs fio (4096 random 4 KiB writes at queue depth 16 and at most 1000 per
// second, with verification: 4 to 8 s under TCG) on file, on device dev, and restarts the
// plugin once 256 of its writes have reached the device; before, if not nil, runs just before
// the restart (a fault that overlaps it). A drain stops the holder first and starts a new one
// after.
func (rig *restartRig) restartUnderFio(file, dev, kind string, before func()) round {
	t := rig.t
	t.Helper()
	fio := exec.Command("fio", "--name=restart", "--filename="+file, "--size=16M", "--bs=4k",
		"--rw=randwrite", "--ioengine=libaio", "--iodepth=16", "--direct=1", "--rate_iops=1000",
		"--verify=crc32c", "--verify_state_save=0", "--do_verify=1", "--verify_fatal=1",
		"--output-format=json")
	var out, errOut strings.Builder
	fio.Stdout, fio.Stderr = &out, &errOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	// Restart once fio's direct writes run (not while it lays out its file): 256 more writes
	// completed on the device than at its start.
	stat := filepath.Join("/sys/block", filepath.Base(dev), "stat")
	base := writesDone(t, stat)
	fioStart := time.Now()
	for writesDone(t, stat) < base+256 {
		select {
		case err := <-fioDone:
			t.Fatalf("fio ended before its writes reached the device: %v\n%s", err, errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(fioStart) > time.Minute {
			_ = fio.Process.Kill()
			t.Fatal("fio's writes do not reach the device")
		}
	}

	if before != nil {
		before() // the fault that overlaps this restart
	}
	if kind == "drain" { // no holder: the plugin drains its connections and closes them
		_ = rig.holder.cmd.Process.Signal(syscall.SIGTERM)
		<-rig.holder.done
		defer func() { rig.holder = rig.startHolder() }()
	}
	old := rig.cur
	r := round{kind: kind, old: old}
	signalled := time.Now()
	switch kind {
	case "kill":
		_ = old.cmd.Process.Signal(syscall.SIGKILL)
		<-old.done
		rig.cur = rig.startPlugin()
	case "overlap":
		// As a surge update: the new process starts while the old one serves and waits for
		// it; the old one, told to stop, hands the devices to it.
		rig.cur = rig.startPlugin()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if b, _ := os.ReadFile(rig.cur.log); strings.Contains(string(b), "Waiting for the predecessor") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the new plugin did not wait for the old one in 2 minutes")
			}
		}
		signalled = time.Now()
		_ = old.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-old.done:
		case <-time.After(time.Minute):
			t.Fatal("the old plugin still runs a minute after SIGTERM")
		}
	default: // graceful, or drain (no holder runs)
		// As a DaemonSet's rolling update: the old process ends (handing its devices to the
		// holder), then the new one starts (taking them).
		_ = old.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-old.done:
		case <-time.After(time.Minute):
			t.Fatal("the old plugin still runs a minute after SIGTERM")
		}
		rig.cur = rig.startPlugin()
	}
	rig.waitServing(rig.cur)
	r.served = time.Since(signalled)
	if kind == "graceful" || kind == "overlap" {
		to := map[string]string{"graceful": "holder", "overlap": "successor"}[kind]
		ob, _ := os.ReadFile(old.log)
		nb, _ := os.ReadFile(rig.cur.log)
		r.handed = strings.Contains(string(ob), "Handed the NBD devices to the "+to) &&
			strings.Contains(string(nb), "Took the NBD devices over")
		for _, l := range strings.Split(string(ob)+string(nb), "\n") {
			if strings.Contains(l, "Handed the NBD devices") || strings.Contains(l, "Took the NBD devices") {
				t.Logf("  %s", l)
			}
		}
	}
	var ferr error
	select {
	case ferr = <-fioDone:
	case <-time.After(3 * time.Minute):
		_ = fio.Process.Kill()
		t.Fatalf("fio hangs after a %s restart:\n%s", kind, errOut.String())
	}
	r.verify = ferr == nil && !strings.Contains(errOut.String(), "verify")
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				Clat struct {
					Max float64 `json:"max"`
				} `json:"clat_ns"`
			} `json:"read"`
			Write struct {
				IOs  int `json:"total_ios"`
				Clat struct {
					Max  float64 `json:"max"`
					Mean float64 `json:"mean"`
				} `json:"clat_ns"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil || len(res.Jobs) == 0 {
		r.errors = 1
		r.fioTail = fmt.Sprintf("unparsable fio output (%v): %s\n%s", err, out.String(), errOut.String())
		return r
	}
	j := res.Jobs[0]
	r.errors = j.Error
	r.stall = time.Duration(max(j.Read.Clat.Max, j.Write.Clat.Max))
	r.ios, r.mean = j.Write.IOs, time.Duration(j.Write.Clat.Mean)
	if r.errors != 0 || !r.verify {
		r.fioTail = errOut.String() + out.String()
	}
	return r
}

// writesDone reads the writes completed by a block device (/sys/block/X/stat, field 5).
func writesDone(t *testing.T, stat string) int64 {
	t.Helper()
	b, err := os.ReadFile(stat)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 5 {
		t.Fatalf("%s: %q", stat, b)
	}
	n, err := strconv.ParseInt(f[4], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mountSource returns the device mounted at path.
func mountSource(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 1 && fs[1] == path {
			return fs[0]
		}
	}
	t.Fatalf("nothing mounted at %s", path)
	return ""
}

func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func p50(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2].Round(time.Millisecond)
}

func maxOf(ds []time.Duration) time.Duration {
	m := time.Duration(0)
	for _, d := range ds {
		m = max(m, d)
	}
	return m.Round(time.Millisecond)
}
