package scale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// Environment of TestScaleBench (make scale-bench sets them from its variables).
const (
	envSteps    = "RAID10_SCALE_STEPS"     // node counts, comma-separated: 10,100,1000
	envVolumes  = "RAID10_SCALE_VOLUMES"   // volumes created and deleted per step (default 200)
	envWorkers  = "RAID10_SCALE_WORKERS"   // concurrent CSI calls (default 16)
	envIdle     = "RAID10_SCALE_IDLE"      // idle window per step (default 60s)
	envTable    = "RAID10_SCALE_TABLE"     // markdown file the table is written to
	envPlugin   = "RAID10_SCALE_PLUGIN"    // the raid10-csi binary; empty: controller in process
	envHold     = "RAID10_SCALE_HOLD"      // volumes created and kept after the last step (memory per volume)
	envClaims   = "RAID10_SCALE_CLAIMS"    // claims with pods through kube-scheduler per step (claims)
	envKCMQPS   = "RAID10_SCALE_KCM_QPS"   // kube-controller-manager's client QPS (burst twice); empty: its default, 20
	envSchedPct = "RAID10_SCALE_SCHED_PCT" // kube-scheduler's percentageOfNodesToScore; empty: its adaptive default
	envSched    = "RAID10_SCALE_SCHEDULER" // another kube-scheduler binary (an experiment's build); empty: the cached one
	capPoll     = 15 * time.Second         // the chart's sidecars.provisioner.capacityPollInterval
)

// stepResult is one row of the table.
type stepResult struct {
	nodes, volumes         int
	startup                time.Duration // StartNode of the step's new nodes, eight at a time
	createRate, deleteRate float64
	p50, p99               time.Duration
	idlePerNodeMin         float64
	churnPerNodeMin        float64
	writesPerVolume        float64
	ctrlRSS, heapPerNode   int64
	toNodeP50, toNodeMax   time.Duration
	toCapP50, toCapMax     time.Duration
	idleTop, churnTop      string
	cpu                    string // CPU seconds per process over the step
}

// TestScaleBench grows a cluster of hollow nodes in steps and measures each step (see
// doc.go). It runs only when RAID10_SCALE_STEPS is set: make scale-bench.
func TestScaleBench(t *testing.T) {
	stepsEnv := os.Getenv(envSteps)
	if stepsEnv == "" {
		testenv.Skip(t, testenv.KindDriven, "the scale benchmark runs with $%s set: make scale-bench", envSteps)
	}
	var steps []int
	for _, f := range strings.Split(stepsEnv, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || (len(steps) > 0 && n <= steps[len(steps)-1]) {
			t.Fatalf("$%s=%q: want increasing positive node counts", envSteps, stepsEnv)
		}
		steps = append(steps, n)
	}
	volumes, workers := envInt(t, envVolumes, 200), envInt(t, envWorkers, 16)
	idle := 60 * time.Second
	if v := os.Getenv(envIdle); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("$%s: %v", envIdle, err)
		}
		idle = d
	}
	lim := benchLimits(t)
	t.Logf("client settings: %s: plugin %v, csi-provisioner %v, agents %v/s burst %d", lim.name, lim.plugin, lim.provisioner, lim.agentQPS, lim.agentBurst)
	claims := envInt(t, envClaims, 0)
	var plane []kubeenv.Option
	var sched kubeenv.SchedulerConfig
	if claims > 0 {
		// Each pod counts against its node's CSINode limit (NodeGetInfo's default).
		if most := steps[0] * driver.DefaultMaxVolumesPerNode; claims > most {
			t.Fatalf("$%s=%d: %d nodes hold at most %d volumes of pods (%d each)", envClaims, claims, steps[0], most, driver.DefaultMaxVolumesPerNode)
		}
		// With $RAID10_SCALE_PROFILE, kube-scheduler serves a CPU profile of the claims.
		sched = kubeenv.SchedulerConfig{PercentageOfNodesToScore: int32(envInt(t, envSchedPct, 0)),
			Profiling: os.Getenv(envProfile) != "", Binary: os.Getenv(envSched)}
		plane = claimsPlane(sched)
		if q := envInt(t, envKCMQPS, 0); q > 0 {
			// The PV binder writes about four times per claim (PV claimRef, the claim's
			// volumeName, both statuses) through kube-controller-manager's client.
			plane = append(plane, kubeenv.WithControllerManagerFlags(fmt.Sprintf("--kube-api-qps=%d", q), fmt.Sprintf("--kube-api-burst=%d", 2*q)))
		}
	}
	cl := startClusterWith(t, capPoll, os.Getenv(envPlugin), lim, plane...)
	cl.sched = sched
	var rows []stepResult
	var claimRows []claimsResult
	tables := func() string {
		if len(claimRows) == 0 {
			return table(rows)
		}
		return table(rows) + "\nClaims: WaitForFirstConsumer through kube-scheduler (each with a pod), then Immediate (no pod; the controller picks the node):\n\n" + claimsTable(claimRows) +
			"\nWhat kube-scheduler spent on the claims' pods (its own metrics; CPU from /proc):\n\n" + schedTable(claimRows)
	}
	for _, n := range steps {
		r := cl.step(t, n, volumes, workers, idle)
		rows = append(rows, r)
		t.Logf("step %d nodes: %+v", n, r)
		if claims > 0 {
			for _, immediate := range []bool{false, true} {
				c := cl.claims(t, immediate, claims, workers, "1Gi", 30*time.Minute)
				claimRows = append(claimRows, c)
				t.Logf("step %d nodes, claims (Immediate %v): %+v", n, immediate, c)
			}
		}
		if path := os.Getenv(envTable); path != "" {
			if err := os.WriteFile(path, []byte(tables()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("\n%s", tables())
	if v := os.Getenv(envHold); v != "" {
		hold := envInt(t, envHold, 0)
		held := holdTable(steps[len(steps)-1], cl.hold(t, hold, workers))
		t.Logf("\n%s", held)
		if path := os.Getenv(envTable); path != "" {
			if err := os.WriteFile(path, []byte(tables()+"\n"+held), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// holdPoint is the memory of the control plane's processes with volumes held.
type holdPoint struct {
	volumes                int
	rate                   float64 // volumes created per second to get here
	ctrlRSS, ctrlHeap      int64   // the controller plugin: VmRSS, Go heap in use
	apiserverRSS, etcdRSS  int64
	provisionerRSS, agents int64 // csi-provisioner's RSS; the hollow agents' heap (this process)
}

// hold creates n volumes of 256 MiB across the nodes, in quarters, and keeps them: after
// each quarter, with the agents' reports in and 20 s of quiet, it reads the memory of the
// controller (whose capacity cache holds every Raid10Volume), the API server and etcd. The
// volumes are deleted at the end. Issue 28's target is 100,000 volumes on 1,000 nodes; the
// slope between the points is the controller's memory per volume.
func (cl *cluster) hold(t *testing.T, n, workers int) []holdPoint {
	ctx := t.Context()
	measure := func(volumes int, rate float64) holdPoint {
		time.Sleep(20 * time.Second)
		p := holdPoint{volumes: volumes, rate: rate, agents: heapInUse()}
		if cl.ctrl != nil {
			p.ctrlRSS = rss(cl.ctrl.Process.Pid)
			p.ctrlHeap = int64(metricValue(cl.ctrlMetrics, "go_memstats_heap_inuse_bytes"))
		}
		p.apiserverRSS, p.etcdRSS, p.provisionerRSS = cl.processRSS("kube-apiserver"), cl.processRSS("etcd"), cl.processRSS("csi-provisioner")
		t.Logf("holding %d volumes: %+v", volumes, p)
		return p
	}
	points := []holdPoint{measure(0, 0)}
	ids := make([]string, n)
	for q := range 4 {
		from, to := n*q/4, n*(q+1)/4
		took := parallel(to-from, workers, func(i int) error {
			i += from
			nd := cl.nodes[(i*7919)%len(cl.nodes)]
			id, err := cl.createVolume(ctx, fmt.Sprintf("hold-%06d", i), nd.Name, 256<<20)
			ids[i] = id
			return err
		}, t)
		points = append(points, measure(to, float64(to-from)/took.Seconds()))
	}
	t.Cleanup(func() {
		took := parallel(n, workers, func(i int) error {
			_, err := cl.csi.DeleteVolume(context.Background(), deleteRequest(ids[i]))
			return err
		}, t)
		t.Logf("deleted the %d held volumes at %.1f/s", n, float64(n)/took.Seconds())
	})
	return points
}

// holdTable is the memory with volumes held, and the controller's growth per volume (the
// slope from the first point to the last).
func holdTable(nodes int, points []holdPoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Volumes held on %d nodes:\n\n", nodes)
	b.WriteString("| volumes held | created/s | controller RSS | controller heap in use | kube-apiserver RSS | etcd RSS | csi-provisioner RSS |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, p := range points {
		fmt.Fprintf(&b, "| %d | %.1f | %d MiB | %d MiB | %d MiB | %d MiB | %d MiB |\n", p.volumes, p.rate, p.ctrlRSS>>20, p.ctrlHeap>>20,
			p.apiserverRSS>>20, p.etcdRSS>>20, p.provisionerRSS>>20)
	}
	first, last := points[0], points[len(points)-1]
	if dv := last.volumes - first.volumes; dv > 0 {
		fmt.Fprintf(&b, "\nPer volume held: controller RSS %.1f KiB, heap %.1f KiB; kube-apiserver %.1f KiB, etcd %.1f KiB, csi-provisioner %.1f KiB.\n",
			float64(last.ctrlRSS-first.ctrlRSS)/float64(dv)/1024, float64(last.ctrlHeap-first.ctrlHeap)/float64(dv)/1024,
			float64(last.apiserverRSS-first.apiserverRSS)/float64(dv)/1024, float64(last.etcdRSS-first.etcdRSS)/float64(dv)/1024,
			float64(last.provisionerRSS-first.provisionerRSS)/float64(dv)/1024)
	}
	return b.String()
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("$%s=%q: want a positive number", name, v)
	}
	return n
}

// step grows the cluster to n nodes and measures: the new nodes' time to Raid10Node and
// CSIStorageCapacity, memory, the idle API load, then volumes created and deleted.
func (cl *cluster) step(t *testing.T, n, volumes, workers int, idle time.Duration) (r stepResult) {
	r = stepResult{nodes: n, volumes: volumes}
	defer profileStep(t, n)()
	cpu0 := cpuSeconds()
	defer func() { r.cpu = cpuShare(cpu0, cpuSeconds()) }()
	heap0 := heapInUse()
	start := time.Now()
	added := cl.addNodes(t, n-len(cl.nodes))
	r.startup = time.Since(start)
	toNode, toCap := cl.reported(t, added, 30*time.Minute)
	r.toNodeP50, r.toNodeMax = quantile(toNode, 0.5), slices.Max(toNode)
	r.toCapP50, r.toCapMax = quantile(toCap, 0.5), slices.Max(toCap)
	r.heapPerNode = (heapInUse() - heap0) / int64(len(added))
	if cl.ctrl != nil {
		r.ctrlRSS = rss(cl.ctrl.Process.Pid)
	}

	// Idle: what the nodes, the controller and the provisioner ask with nothing to do.
	before, byBefore := cl.apiRequests(t)
	time.Sleep(idle)
	after, byAfter := cl.apiRequests(t)
	r.idlePerNodeMin = (after - before) / float64(n) / idle.Minutes()
	r.idleTop = top(byBefore, byAfter, 4)

	// Churn: volumes created on every node in turn, then deleted.
	ctx := t.Context()
	ids := make([]string, volumes)
	lat := make([]time.Duration, volumes)
	churnStart := time.Now()
	created := parallel(volumes, workers, func(i int) error {
		nd := cl.nodes[(i*7919)%len(cl.nodes)]
		t0 := time.Now()
		id, err := cl.createVolume(ctx, fmt.Sprintf("pvc-%d-%05d", n, i), nd.Name, 1<<30)
		lat[i], ids[i] = time.Since(t0), id
		return err
	}, t)
	deleted := parallel(volumes, workers, func(i int) error {
		_, err := cl.csi.DeleteVolume(ctx, deleteRequest(ids[i]))
		return err
	}, t)
	churn := time.Since(churnStart)
	end, byEnd := cl.apiRequests(t)
	r.createRate, r.deleteRate = float64(volumes)/created.Seconds(), float64(volumes)/deleted.Seconds()
	r.p50, r.p99 = quantile(lat, 0.5), quantile(lat, 0.99)
	r.churnPerNodeMin = (end - after) / float64(n) / churn.Minutes()
	var writes float64
	for k, v := range byEnd {
		if verb, _, _ := strings.Cut(k, " "); verb == "POST" || verb == "PUT" || verb == "PATCH" || verb == "DELETE" ||
			verb == "CREATE" || verb == "UPDATE" || verb == "APPLY" {
			writes += v - byAfter[k]
		}
	}
	r.writesPerVolume = writes / float64(volumes)
	r.churnTop = top(byAfter, byEnd, 6)
	return r
}

// parallel runs op(0..n-1) on workers goroutines and returns how long it took; any error
// fails the test.
func parallel(n, workers int, op func(i int) error, t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	errs := testenv.Each(n, workers, op)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// heapInUse is this process's heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// rss is the resident memory of process pid (VmRSS), 0 when unknown.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// top names the k request kinds that grew most between two counts.
func top(before, after map[string]float64, k int) string {
	type kv struct {
		k string
		v float64
	}
	var l []kv
	for key, v := range after {
		if d := v - before[key]; d > 0 {
			l = append(l, kv{key, d})
		}
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	var parts []string
	for _, e := range l[:min(k, len(l))] {
		parts = append(parts, fmt.Sprintf("%s %.0f", e.k, e.v))
	}
	return strings.Join(parts, ", ")
}

// table is the markdown table of the steps so far, then each step's busiest requests.
func table(rows []stepResult) string {
	var b strings.Builder
	b.WriteString("| nodes | volumes | created/s | deleted/s | CreateVolume p50 | p99 | API req/node/min idle | under churn | writes/volume | controller RSS | heap/agent | Raid10Node p50/max | CSIStorageCapacity p50/max | nodes started in |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %d | %.1f | %.1f | %s | %s | %.1f | %.1f | %.1f | %d MiB | %d KiB | %s / %s | %s / %s | %s |\n",
			r.nodes, r.volumes, r.createRate, r.deleteRate, ms(r.p50), ms(r.p99), r.idlePerNodeMin, r.churnPerNodeMin,
			r.writesPerVolume, r.ctrlRSS>>20, r.heapPerNode>>10, ms(r.toNodeP50), ms(r.toNodeMax), ms(r.toCapP50), ms(r.toCapMax), ms(r.startup))
	}
	b.WriteString("\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "- %d nodes, idle: %s; churn: %s; CPU over the step: %s\n", r.nodes, r.idleTop, r.churnTop, r.cpu)
	}
	return b.String()
}

// processRSS is the VmRSS of this process's child named comm (kube-apiserver, etcd,
// csi-provisioner), 0 when there is none.
func (cl *cluster) processRSS(comm string) int64 {
	dirs, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		open, close := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
		if open < 0 || close < open || string(stat[open+1:close]) != comm {
			continue
		}
		if f := strings.Fields(string(stat[close+1:])); len(f) > 1 && f[1] == self {
			return rss(pid)
		}
	}
	return 0
}
