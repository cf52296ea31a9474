package perf

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// switchesEnv (RAID10_PERF_SWITCHES=1) logs, for each case, the guest's threads that were
// switched out most often during the run, per I/O: which thread sleeps and wakes on the way
// of a request (fio, the serving process's threads, the kernel's workers), read from each
// thread's status before and after the run, so the run itself is not disturbed.
const switchesEnv = "RAID10_PERF_SWITCHES"

// threadSwitch is one guest thread's context switches (voluntary, involuntary).
type threadSwitch struct {
	name      string
	vol, invo float64
}

// guestSwitches reads every thread's context switches, by "pid/tid".
func guestSwitches() map[string]threadSwitch {
	out := map[string]threadSwitch{}
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/status")
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var ts threadSwitch
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "Name":
				ts.name = v
			case "voluntary_ctxt_switches":
				ts.vol, _ = strconv.ParseFloat(v, 64)
			case "nonvoluntary_ctxt_switches":
				ts.invo, _ = strconv.ParseFloat(v, 64)
			}
		}
		rel := strings.TrimPrefix(filepath.Dir(p), "/proc/")
		pid, _, _ := strings.Cut(rel, "/")
		if pid == strconv.Itoa(os.Getpid()) {
			// This process: the server and the engine; where the thread sleeps says its
			// role (io_uring_enter's wait: a ublk queue thread or a reaper; futex: a Go
			// runtime thread without work).
			w, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "wchan"))
			ts.name = "server(" + string(w) + ")"
		}
		out[rel] = ts
	}
	return out
}

// switchView starts counting when RAID10_PERF_SWITCHES is set; the returned func takes the
// I/Os of the run (or its seconds, for switches per second) and returns the report (empty
// when not counting).
func switchView() func(ios float64) string {
	if os.Getenv(switchesEnv) == "" {
		return func(float64) string { return "" }
	}
	before := guestSwitches()
	return func(ios float64) string {
		after := guestSwitches()
		type row struct {
			id        string
			name      string
			vol, invo float64
		}
		var rows []row
		for id, a := range after {
			b := before[id]
			r := row{id, a.name, a.vol - b.vol, a.invo - b.invo}
			if r.vol+r.invo > 0 {
				rows = append(rows, r)
			}
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].vol+rows[i].invo > rows[j].vol+rows[j].invo })
		var b strings.Builder
		b.WriteString("threads switched out (voluntary + involuntary):\n")
		for i, r := range rows {
			if i == 12 {
				break
			}
			fmt.Fprintf(&b, "  %-12s %-24s %.2f + %.2f\n", r.id, r.name, r.vol/ios, r.invo/ios)
		}
		return b.String()
	}
}
