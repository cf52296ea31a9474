package scale

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// schedSample is kube-scheduler's own timing histograms at one moment: sum and count of
// seconds by a label's value.
type schedSample struct {
	attempt    [2]float64            // scheduling_attempt_duration_seconds, scheduled: scheduling and binding cycles
	algorithm  [2]float64            // scheduling_algorithm_duration_seconds: Filter and Score, in the serial cycle
	extension  map[string][2]float64 // framework_extension_point_duration_seconds by extension point
	filterByPl map[string][2]float64 // plugin_execution_duration_seconds of Filter, by plugin (sampled)
}

// schedMetrics reads kube-scheduler's /metrics.
func (cl *cluster) schedMetrics(t *testing.T) schedSample {
	t.Helper()
	raw, err := cl.env.Get(t.Context(), cl.env.SchedulerURL+"/metrics")
	if err != nil {
		t.Fatalf("kube-scheduler /metrics: %v", err)
	}
	s := schedSample{extension: map[string][2]float64{}, filterByPl: map[string][2]float64{}}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")+1]
		name = name[:max(len(name)-1, 0)]
		base, part := strings.CutSuffix(name, "_sum")
		if !part {
			base, part = strings.CutSuffix(name, "_count")
		}
		if !part {
			continue
		}
		i := 0
		if strings.HasSuffix(name, "_count") {
			i = 1
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		switch base {
		case "scheduler_scheduling_attempt_duration_seconds":
			if label(line, "result") == "scheduled" {
				s.attempt[i] += v
			}
		case "scheduler_scheduling_algorithm_duration_seconds":
			s.algorithm[i] += v
		case "scheduler_framework_extension_point_duration_seconds":
			if label(line, "status") == "Success" {
				e := s.extension[label(line, "extension_point")]
				e[i] += v
				s.extension[label(line, "extension_point")] = e
			}
		case "scheduler_plugin_execution_duration_seconds":
			if label(line, "extension_point") == "Filter" {
				p := s.filterByPl[label(line, "plugin")]
				p[i] += v
				s.filterByPl[label(line, "plugin")] = p
			}
		}
	}
	return s
}

// schedDelta is what kube-scheduler spent between two samples.
type schedDelta struct {
	attempts           int
	attemptMean        time.Duration // per pod scheduled: scheduling and binding cycles
	algorithmMean      time.Duration // per pod: Filter and Score, which the scheduler runs one pod at a time
	filterMean         time.Duration // per pod: the Filter extension point, every node checked
	preBindMean        time.Duration // per pod: PreBind (VolumeBinding waits for the PV here)
	filterTop          string        // Filter's plugins by their share of the sampled time
	profile            string        // the CPU profile's file, or ""
	profileTop         string        // its heaviest functions (flat), or ""
	cpuPerPod          time.Duration // kube-scheduler's CPU seconds over the claims per pod
	percentageOfScored int32
	binary             string // another kube-scheduler's path, or ""
}

func mean(a, b [2]float64) time.Duration {
	n := b[1] - a[1]
	if n <= 0 {
		return 0
	}
	return time.Duration((b[0] - a[0]) / n * float64(time.Second))
}

// delta is b less a.
func (a schedSample) delta(b schedSample) schedDelta {
	d := schedDelta{
		attempts:      int(b.attempt[1] - a.attempt[1]),
		attemptMean:   mean(a.attempt, b.attempt),
		algorithmMean: mean(a.algorithm, b.algorithm),
		filterMean:    mean(a.extension["Filter"], b.extension["Filter"]),
		preBindMean:   mean(a.extension["PreBind"], b.extension["PreBind"]),
	}
	type share struct {
		plugin string
		sec    float64
	}
	var shares []share
	var total float64
	for p, v := range b.filterByPl {
		s := v[0] - a.filterByPl[p][0]
		if s > 0 {
			shares = append(shares, share{p, s})
			total += s
		}
	}
	sort.Slice(shares, func(i, j int) bool { return shares[i].sec > shares[j].sec })
	var parts []string
	for _, s := range shares[:min(3, len(shares))] {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", s.plugin, 100*s.sec/total))
	}
	d.filterTop = strings.Join(parts, ", ")
	return d
}

// schedProfile takes a CPU profile of kube-scheduler for the given seconds into dir (the
// file's name says the node count) and returns its path and its heaviest functions by
// flat time, or the error.
func (cl *cluster) schedProfile(t *testing.T, dir string, seconds int) (string, string, error) {
	raw, err := cl.env.Get(t.Context(), fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", cl.env.SchedulerURL, seconds))
	if err != nil {
		return "", "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("kube-scheduler-%d-nodes.pprof", len(cl.nodes)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		return "", "", err
	}
	top, err := pprofTop(path, 6)
	return path, top, err
}

// schedTable is the markdown table of what kube-scheduler spent per pod in the claims.
func schedTable(rows []claimsResult) string {
	var b strings.Builder
	b.WriteString("| nodes | percentageOfNodesToScore | pods scheduled | attempt per pod (both cycles) | algorithm per pod (one pod at a time) | of it Filter | PreBind (waits for the PV) | scheduler CPU per pod | Filter's plugins (sampled) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	ms := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	for _, r := range rows {
		if r.immediate {
			continue // no pods
		}
		s := r.sched
		pct := "default"
		if s.percentageOfScored > 0 {
			pct = fmt.Sprintf("%d%%", s.percentageOfScored)
		}
		if s.binary != "" {
			pct += " (kube-scheduler " + s.binary + ")"
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %s | %s | %s | %s | %s | %s |\n", r.nodes, pct, s.attempts,
			ms(s.attemptMean), ms(s.algorithmMean), ms(s.filterMean), ms(s.preBindMean), ms(s.cpuPerPod), s.filterTop)
	}
	for _, r := range rows {
		if r.sched.profile != "" {
			fmt.Fprintf(&b, "\nkube-scheduler at %d nodes, CPU profile %s, heaviest (flat):\n\n```\n%s```\n", r.nodes, r.sched.profile, r.sched.profileTop)
		}
	}
	return b.String()
}

// pprofTop is `go tool pprof -top` of a profile: its first n functions by flat time, with
// the header lines (total samples, what was dropped).
func pprofTop(path string, n int) (string, error) {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount="+strconv.Itoa(n), path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go tool pprof %s: %w: %s", path, err, out)
	}
	return string(out), nil
}
