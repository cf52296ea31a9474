package vm

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FioJob is one fio job with libaio and O_DIRECT: the shape of every fio run of the VM
// tests. The zero values of BS, RW and IODepth are 4k, randwrite and 16.
type FioJob struct {
	Name, File string
	Size       string // --size; "" leaves fio's default (the whole device)
	BS, RW     string
	IODepth    int
	RateIOPS   int      // --rate_iops when > 0
	Verify     bool     // crc32c in every block, read back and checked after the writes, fatal on a mismatch
	Extra      []string // more options, after the above
}

// Args are fio's arguments for the job.
func (j FioJob) Args() []string {
	bs, rw, qd := j.BS, j.RW, j.IODepth
	if bs == "" {
		bs = "4k"
	}
	if rw == "" {
		rw = "randwrite"
	}
	if qd == 0 {
		qd = 16
	}
	a := []string{"--name=" + j.Name, "--filename=" + j.File}
	if j.Size != "" {
		a = append(a, "--size="+j.Size)
	}
	a = append(a, "--bs="+bs, "--rw="+rw, "--ioengine=libaio", "--iodepth="+strconv.Itoa(qd), "--direct=1")
	if j.RateIOPS > 0 {
		a = append(a, "--rate_iops="+strconv.Itoa(j.RateIOPS))
	}
	if j.Verify {
		a = append(a, "--verify=crc32c", "--verify_state_save=0", "--do_verify=1", "--verify_fatal=1")
	}
	return append(a, j.Extra...)
}

// FioVerify runs a verified job (Verify is set for it) to its end and fails t unless fio
// reports no error; it returns fio's output.
func FioVerify(t testing.TB, j FioJob) string {
	t.Helper()
	j.Verify = true
	out := Sh(t, "fio", j.Args()...)
	if !strings.Contains(out, "err= 0") {
		t.Fatalf("fio reported errors:\n%s", out)
	}
	return out
}

// FioDir is one direction (read or write) of a job in fio's JSON report.
type FioDir struct {
	IOPS     float64 `json:"iops"`
	BW       float64 `json:"bw_bytes"`
	TotalIOs float64 `json:"total_ios"`
	IOBytes  int64   `json:"io_bytes"`
	Clat     struct {
		Max  int64   `json:"max"`  // nanoseconds
		Mean float64 `json:"mean"` // nanoseconds
	} `json:"clat_ns"`
}

// FioReport is the first job of fio's JSON report (--output-format=json).
type FioReport struct {
	Jobs  int // how many jobs the report holds
	Error int
	Read  FioDir
	Write FioDir
}

// IOPS is the job's reads and writes per second together.
func (r FioReport) IOPS() float64 { return r.Read.IOPS + r.Write.IOPS }

// BW is the job's read and write bandwidth together, bytes per second.
func (r FioReport) BW() float64 { return r.Read.BW + r.Write.BW }

// IOs is how many reads and writes the job completed.
func (r FioReport) IOs() float64 { return r.Read.TotalIOs + r.Write.TotalIOs }

// ParseFio reads fio's JSON report, skipping the notes fio may print before it.
func ParseFio(out []byte) (FioReport, error) {
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	var v struct {
		Jobs []struct {
			Error int    `json:"error"`
			Read  FioDir `json:"read"`
			Write FioDir `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return FioReport{}, err
	}
	if len(v.Jobs) == 0 {
		return FioReport{}, errors.New("no job in fio's report")
	}
	j := v.Jobs[0]
	return FioReport{Jobs: len(v.Jobs), Error: j.Error, Read: j.Read, Write: j.Write}, nil
}

// RunFio runs the job with a JSON report and returns it; it fails t when fio fails,
// reports an error or completes no I/O.
func RunFio(t testing.TB, j FioJob) FioReport {
	t.Helper()
	out, err := exec.Command("fio", append(j.Args(), "--output-format=json")...).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("fio %s on %s: %v\n%s%s", j.Name, j.File, err, out, stderr)
	}
	r, err := ParseFio(out)
	if err != nil {
		t.Fatalf("fio output: %v\n%s", err, out)
	}
	if r.Error != 0 {
		t.Fatalf("fio %s on %s: error %d", j.Name, j.File, r.Error)
	}
	if r.IOs() == 0 {
		t.Fatalf("fio %s on %s: no I/O completed", j.Name, j.File)
	}
	return r
}

// FioUnderKills runs the verified job in the background and calls kill n times, one
// interval apart, while it writes: kill stops the serving process (i counts from 0, into
// is the time since fio started) and starts the next one. fio must then end within
// 4 minutes with no error and its verification passed, and at least n-1 kills must have
// happened while it still wrote; FioUnderKills fails t otherwise and returns fio's output.
// This is the restart test of every frontend: a kill must cost the filesystem above no
// write it was told had completed.
func FioUnderKills(t testing.TB, j FioJob, n int, interval time.Duration, kill func(i int, into time.Duration)) string {
	t.Helper()
	j.Verify = true
	fio := exec.Command("fio", j.Args()...)
	var out strings.Builder
	fio.Stdout, fio.Stderr = &out, &out
	start := time.Now()
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fio.Wait() }()
	during := 0
	for i := range n {
		time.Sleep(interval)
		select {
		case err := <-done:
			done <- err
			t.Logf("fio ended before kill %d", i+1)
		default:
			during++
		}
		kill(i, time.Since(start).Round(time.Millisecond))
	}
	var ferr error
	select {
	case ferr = <-done:
	case <-time.After(4 * time.Minute):
		_ = fio.Process.Kill()
		t.Fatalf("fio hangs:\n%s", out.String())
	}
	t.Logf("fio took %s, %d of %d kills while it wrote", time.Since(start).Round(time.Millisecond), during, n)
	if ferr != nil || !strings.Contains(out.String(), "err= 0") || strings.Contains(out.String(), "verify:") {
		t.Fatalf("fio failed across restarts: %v\n%s", ferr, out.String())
	}
	if during < n-1 {
		t.Fatalf("only %d kills happened while fio wrote", during)
	}
	return out.String()
}
