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

// pluginProc is one raid10-csi process of TestRestartInGuest (a plugin or a holder).
type pluginProc struct {
	cmd   *exec.Cmd
	log   string
	start time.Time
	done  chan struct{}
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
	return r.stageWith(fs, name, size, nil, nil)
}

// stageWith is stage with the StorageClass parameters params and the node-stage secrets
// (an encrypted volume: the device mounted is its dm-crypt mapping).
func (r *restartRig) stageWith(fs, name string, size int64, params, secrets map[string]string) (id, staging, dev string) {
	r.t.Helper()
	ctx := context.Background()
	capab := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol, err := csi.NewControllerClient(r.conn).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{capab}})
	if err != nil {
		r.t.Fatalf("CreateVolume: %v", err)
	}
	id = vol.GetVolume().GetVolumeId()
	staging = filepath.Join(r.dir, "staging-"+name)
	if _, err := csi.NewNodeClient(r.conn).NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id,
		StagingTargetPath: staging, VolumeCapability: capab, VolumeContext: vol.GetVolume().GetVolumeContext(),
		Secrets: secrets}); err != nil {
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
	vm.Sh(r.t, "umount", staging)
	if fs == "xfs" {
		vm.Sh(r.t, "xfs_repair", "-n", dev)
	} else {
		vm.Sh(r.t, "e2fsck", "-fn", dev)
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
	job := vm.FioJob{Name: "restart", File: file, Size: "16M", RateIOPS: 1000, Verify: true,
		Extra: []string{"--output-format=json"}}
	fio := exec.Command("fio", job.Args()...)
	var out, errOut strings.Builder
	fio.Stdout, fio.Stderr = &out, &errOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	waitWrites(t, dev, 256, fio, fioDone, &errOut)

	if before != nil {
		before() // the fault that overlaps this restart
	}
	if kind == "drain" { // no holder: the plugin drains its connections and closes them
		_ = rig.holder.cmd.Process.Signal(syscall.SIGTERM)
		<-rig.holder.done
		defer func() { rig.holder = rig.startHolder() }()
	}
	r := round{kind: kind, old: rig.cur}
	signalled := rig.restart(kind)
	rig.waitServing(rig.cur)
	r.served = time.Since(signalled)
	if kind == "graceful" || kind == "overlap" {
		r.handed = rig.handedOver(r.old, map[string]string{"graceful": "holder", "overlap": "successor"}[kind])
	}
	var ferr error
	select {
	case ferr = <-fioDone:
	case <-time.After(3 * time.Minute):
		_ = fio.Process.Kill()
		t.Fatalf("fio hangs after a %s restart:\n%s", kind, errOut.String())
	}
	r.verify = ferr == nil && !strings.Contains(errOut.String(), "verify")
	rep, err := vm.ParseFio([]byte(out.String()))
	if err != nil {
		r.errors = 1
		r.fioTail = fmt.Sprintf("unparsable fio output (%v): %s\n%s", err, out.String(), errOut.String())
		return r
	}
	r.errors = rep.Error
	r.stall = time.Duration(max(rep.Read.Clat.Max, rep.Write.Clat.Max))
	r.ios, r.mean = int(rep.Write.TotalIOs), time.Duration(rep.Write.Clat.Mean)
	if r.errors != 0 || !r.verify {
		r.fioTail = errOut.String() + out.String()
	}
	return r
}

// waitWrites returns once fio's direct writes run (not while it lays out its file): n more
// writes completed on dev than at the call. It fails t when fio ends first or its writes
// do not reach the device within a minute.
func waitWrites(t *testing.T, dev string, n int64, fio *exec.Cmd, fioDone chan error, errOut *strings.Builder) {
	t.Helper()
	stat := filepath.Join("/sys/block", sysBlockName(t, dev), "stat")
	base := writesDone(t, stat)
	start := time.Now()
	for writesDone(t, stat) < base+n {
		select {
		case err := <-fioDone:
			t.Fatalf("fio ended before its writes reached the device: %v\n%s", err, errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > time.Minute {
			_ = fio.Process.Kill()
			t.Fatal("fio's writes do not reach the device")
		}
	}
}

// restart replaces the serving plugin the way kind says and returns when the old one was
// signalled: kill (SIGKILL, then a new one), overlap (a new one first, which waits for the
// old one, then SIGTERM: a surge update), graceful or drain (SIGTERM, then a new one: a
// rolling update).
func (rig *restartRig) restart(kind string) (signalled time.Time) {
	t := rig.t
	t.Helper()
	old := rig.cur
	signalled = time.Now()
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
		rig.sigterm(old)
	default: // graceful, or drain (no holder runs)
		// As a DaemonSet's rolling update: the old process ends (handing its devices to the
		// holder), then the new one starts (taking them).
		rig.sigterm(old)
		rig.cur = rig.startPlugin()
	}
	return signalled
}

// sigterm stops the old plugin p with SIGTERM and fails the test if it still runs a
// minute later.
func (rig *restartRig) sigterm(p *pluginProc) {
	rig.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		rig.t.Fatal("the old plugin still runs a minute after SIGTERM")
	}
}

// handedOver reports whether the logs of old and of the serving plugin show the devices
// handed to "to" (holder or successor) and taken over, and logs those lines.
func (rig *restartRig) handedOver(old *pluginProc, to string) bool {
	ob, _ := os.ReadFile(old.log)
	nb, _ := os.ReadFile(rig.cur.log)
	for _, l := range strings.Split(string(ob)+string(nb), "\n") {
		if strings.Contains(l, "Handed the NBD devices") || strings.Contains(l, "Took the NBD devices") {
			rig.t.Logf("  %s", l)
		}
	}
	return strings.Contains(string(ob), "Handed the NBD devices to the "+to) &&
		strings.Contains(string(nb), "Took the NBD devices over")
}

// sysBlockName is dev's name under /sys/block: its own (nbd0, ublkb0) or, for a
// device-mapper node such as /dev/mapper/raid10-crypt-<id>, the dm-N whose dm/name it is.
func sysBlockName(t *testing.T, dev string) string {
	t.Helper()
	name := filepath.Base(dev)
	if _, err := os.Stat(filepath.Join("/sys/block", name)); err == nil {
		return name
	}
	dms, _ := filepath.Glob("/sys/block/dm-*")
	for _, d := range dms {
		if b, err := os.ReadFile(filepath.Join(d, "dm", "name")); err == nil && strings.TrimSpace(string(b)) == name {
			return filepath.Base(d)
		}
	}
	t.Fatalf("%s: no block device of that name in /sys/block", dev)
	return ""
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
