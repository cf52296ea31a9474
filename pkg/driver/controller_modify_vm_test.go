package driver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestModifyVolumeInGuest: a volume's read IOPS limit changed live while fio reads its real
// /dev/nbdX, the whole way down: CreateVolume with a mutable parameter, the node service
// stages the block volume, ControllerModifyVolume (over the standalone store, which puts
// the limits on the pool as the node agent does) raises the limit halfway through one fio
// run. fio's own per-second IOPS log must follow the first limit, then the second: each
// phase's median second within 0.9 to 1.1 of its limit. The limits are set at fractions of the
// device's unlimited rate measured first in the same VM, so the emulated CPUs' speed only
// scales them.
func TestModifyVolumeInGuest(t *testing.T) {
	vm.GuestHalf(t, "TestNodeVM")
	vm.RequireTools(t, "fio")
	dir := t.TempDir()
	p, _ := openFilePool(t, 256<<20)
	c := &ControllerServer{store: openLocalStore(t, p, filepath.Join(dir, LocalRecordsFile)), locks: &VolumeLocks{},
		readyTimeout: 30 * time.Second, pollInterval: 10 * time.Millisecond}
	ctx := context.Background()
	const id = "pvc-fio"
	req := createReq(id, 64<<20, localNode)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	if _, err := c.CreateVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	_, state, att := guestAttacher(t, p, dir, kernel.Options{Timeout: 30 * time.Second, DeadConnTimeout: 60 * time.Second})
	defer att.Close(context.Background())
	ns := guestNodeServer(t, att)
	staging := filepath.Join(dir, "staging")
	if _, err := ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	}()
	rec, ok := state.Get(id)
	if !ok {
		t.Fatal("no device recorded for the staged volume")
	}
	dev := kernel.DevicePath(rec.Index)
	job := vm.FioJob{Name: "qos", File: dev, BS: "4k", RW: "randread", IODepth: 8, Extra: []string{"--time_based", "--runtime=4"}}
	// The device's unlimited rate: the best of up to three short runs, as the emulated CPUs
	// share a busy host and one run may stall.
	var free float64
	for try := 0; try < 3 && free < 200; try++ {
		free = max(free, vm.RunFio(t, job).Read.IOPS)
	}
	modify := func(iops int) {
		t.Helper()
		if _, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
			MutableParameters: map[string]string{ParamMaxReadIOPS: strconv.Itoa(iops)}}); err != nil {
			t.Fatal(err)
		}
	}
	// The limits: a twelfth, then a fifth of the free rate, so that a slower spell of the
	// host (its load moves the VM's speed threefold) still leaves the device above them
	// (never above 2000: the bucket's default burst is 100 ms of it, small beside a phase
	// either way).
	low, high := int(min(free/12, 400)), int(min(free/5, 2000))
	if low < 10 {
		t.Fatalf("the device does %.0f reads/s without limits: too slow to measure a limit", free)
	}
	t.Logf("%s unlimited: %.0f reads/s; limits %d, then %d", dev, free, low, high)
	modify(low)

	// One fio run of 16 s; the limit is raised 8 s in. fio logs its IOPS every second, in
	// its own clock, which starts when the job does (a second or two after the command
	// under emulation, four on a loaded host): the report's end time less the job's runtime
	// places the change on it, and the 8 s count from the device's first reads.
	logPrefix := filepath.Join(dir, "qos")
	job.Extra = []string{"--time_based", "--runtime=16", "--write_iops_log=" + logPrefix, "--log_avg_msec=1000", "--per_job_logs=0",
		"--output-format=json"}
	fio := exec.Command("fio", job.Args()...)
	var out, stderr strings.Builder
	fio.Stdout, fio.Stderr = &out, &stderr
	reads0 := deviceReads(t, dev)
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	for began := time.Now(); deviceReads(t, dev) == reads0; time.Sleep(100 * time.Millisecond) {
		if time.Since(began) > time.Minute {
			t.Fatalf("fio read nothing from %s in a minute", dev)
		}
	}
	time.Sleep(8 * time.Second)
	modify(high)
	changed := time.Now()
	if err := fio.Wait(); err != nil {
		t.Fatalf("fio: %v\n%s%s", err, out.String(), stderr.String())
	}
	jobStart := fioJobStart(t, out.String())
	at := changed.Sub(jobStart)
	samples := readIOPSLog(t, logPrefix+"_iops.log")
	t.Logf("limit raised %s into the job; fio's IOPS per second: %v", at.Round(time.Millisecond), samples)
	// A sample covers the second before its time. The old limit: every whole second before
	// the change but the first; the new: every second from half a second after it.
	// A phase's rate is the median of its seconds: one second the host stalled the VM does
	// not move it.
	phase := func(in func(end time.Duration) bool) float64 {
		var v []float64
		for _, s := range samples {
			if in(s.at) {
				v = append(v, s.iops)
			}
		}
		if len(v) < 3 {
			t.Fatalf("only %d IOPS samples in a phase: %v", len(v), samples)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, ph := range []struct {
		name  string
		in    func(end time.Duration) bool
		limit int
	}{
		{"old limit", func(end time.Duration) bool { return end > 1500*time.Millisecond && end <= at }, low},
		{"new limit", func(end time.Duration) bool { return end-time.Second >= at+500*time.Millisecond }, high},
	} {
		got := phase(ph.in)
		ratio := got / float64(ph.limit)
		t.Logf("%s %d: fio read %.0f IOPS (median second), ratio %.3f", ph.name, ph.limit, got, ratio)
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("%s %d: fio read %.0f IOPS (ratio %.3f), want within 0.9 to 1.1 of the limit", ph.name, ph.limit, got, ratio)
		}
	}
}

// fioJobStart is when the job of fio's JSON report began: the report's time less the job's
// runtime. It fails t when fio reported an error.
func fioJobStart(t *testing.T, report string) time.Time {
	t.Helper()
	if i := strings.IndexByte(report, '{'); i > 0 {
		report = report[i:]
	}
	var r struct {
		TimestampMs int64 `json:"timestamp_ms"`
		Jobs        []struct {
			Error      int   `json:"error"`
			JobRuntime int64 `json:"job_runtime"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(report), &r); err != nil || len(r.Jobs) == 0 || r.Jobs[0].Error != 0 {
		t.Fatalf("fio's report (%v):\n%s", err, report)
	}
	return time.UnixMilli(r.TimestampMs - r.Jobs[0].JobRuntime)
}

// iopsSample is one line of fio's IOPS log: the end of the interval since the job started,
// and the mean IOPS over it.
type iopsSample struct {
	at   time.Duration
	iops float64
}

func (s iopsSample) String() string {
	return fmt.Sprintf("%s:%.0f", s.at.Round(time.Millisecond), s.iops)
}

// readIOPSLog reads fio's IOPS log ("msec, value, direction, block size, offset" a line)
// and sums the directions of one interval.
func readIOPSLog(t *testing.T, path string) []iopsSample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []iopsSample
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ",")
		if len(fields) < 2 {
			continue
		}
		ms, err1 := strconv.ParseInt(strings.TrimSpace(fields[0]), 10, 64)
		v, err2 := strconv.ParseFloat(strings.TrimSpace(fields[1]), 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: line %q", path, sc.Text())
		}
		at := time.Duration(ms) * time.Millisecond
		if n := len(out); n > 0 && out[n-1].at == at {
			out[n-1].iops += v
			continue
		}
		out = append(out, iopsSample{at, v})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// deviceReads is the reads completed on the block device dev (/sys/block/<name>/stat).
func deviceReads(t *testing.T, dev string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		t.Fatalf("%s stat: empty", dev)
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		t.Fatalf("%s stat %q: %v", dev, b, err)
	}
	return n
}
