package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// envLimits picks the client settings TestScaleBench runs the controller plugin, the hollow
// agents and csi-provisioner with: "chart" (the default) is the chart's values.yaml, as the
// chart deploys them; "defaults" passes no rate-limit or thread flag, so each binary keeps
// its own (client-go's 5 requests a second with a burst of 10, the provisioner's one
// capacity thread and 1 capacity write a second): the settings before the chart set them,
// and the only ones a plugin binary built before --kube-api-qps takes.
const envLimits = "RAID10_SCALE_LIMITS"

// envProfile names a directory that gets, per step, the benchmark process's CPU profile
// (cpu-<nodes>.pprof: the hollow nodes, the benchmark's clients) and heap profile at the
// step's end (heap-<nodes>.pprof).
const envProfile = "RAID10_SCALE_PROFILE"

// chartValues is the part of charts/raid10-csi/values.yaml the benchmark runs with.
type chartValues struct {
	Controller clientLimits `json:"controller"`
	Node       clientLimits `json:"node"`
	Sidecars   struct {
		Provisioner struct {
			clientLimits
			KubeAPICapacityQPS   float64 `json:"kubeAPICapacityQPS"`
			KubeAPICapacityBurst int     `json:"kubeAPICapacityBurst"`
			CapacityThreads      int     `json:"capacityThreads"`
			WorkerThreads        int     `json:"workerThreads"`
		} `json:"provisioner"`
	} `json:"sidecars"`
}

// clientLimits is a Kubernetes client's rate limit in the chart's values.
type clientLimits struct {
	KubeAPIQPS   float64 `json:"kubeAPIQPS"`
	KubeAPIBurst int     `json:"kubeAPIBurst"`
}

// limits is what a run uses: flags for the plugin and the provisioner, and the hollow
// agents' rate limit.
type limits struct {
	name                string
	plugin, provisioner []string
	agentQPS            float32
	agentBurst          int
}

// benchLimits reads $RAID10_SCALE_LIMITS and, for "chart", the chart's values.
func benchLimits(t *testing.T) limits {
	t.Helper()
	switch v := os.Getenv(envLimits); v {
	case "defaults":
		// The agents as client-go's default: the chart's node values are the same.
		return limits{name: "binaries' defaults", agentQPS: 5, agentBurst: 10}
	case "", "chart":
		data, err := os.ReadFile(filepath.Join(crdDir, "..", "values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var cv chartValues
		if err := yaml.Unmarshal(data, &cv); err != nil {
			t.Fatalf("chart values: %v", err)
		}
		p := cv.Sidecars.Provisioner
		f := strconv.FormatFloat
		return limits{
			name: "chart",
			plugin: []string{"--kube-api-qps=" + f(cv.Controller.KubeAPIQPS, 'g', -1, 64),
				"--kube-api-burst=" + strconv.Itoa(cv.Controller.KubeAPIBurst)},
			provisioner: []string{"--kube-api-qps=" + f(p.KubeAPIQPS, 'g', -1, 64), "--kube-api-burst=" + strconv.Itoa(p.KubeAPIBurst),
				"--kube-api-capacity-qps=" + f(p.KubeAPICapacityQPS, 'g', -1, 64), "--kube-api-capacity-burst=" + strconv.Itoa(p.KubeAPICapacityBurst),
				"--capacity-threads=" + strconv.Itoa(p.CapacityThreads), "--worker-threads=" + strconv.Itoa(p.WorkerThreads)},
			agentQPS: float32(cv.Node.KubeAPIQPS), agentBurst: cv.Node.KubeAPIBurst,
		}
	default:
		t.Fatalf("$%s=%q: want chart or defaults", envLimits, v)
		return limits{}
	}
}

// profileStep starts the step's CPU profile when $RAID10_SCALE_PROFILE is set, in segments
// of profileSegment (cpu-<nodes>-<k>.pprof), so that a step stopped before its end still
// leaves its profile; the function it returns ends the last segment and writes the heap
// profile (heap-<nodes>.pprof).
func profileStep(t *testing.T, nodes int) func() {
	t.Helper()
	dir := os.Getenv(envProfile)
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	segment := func(k int) *os.File {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("cpu-%d-%d.pprof", nodes, k)))
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			t.Errorf("CPU profile: %v", err)
			return nil
		}
		return f
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		f := segment(0)
		for k := 1; ; k++ {
			select {
			case <-stop:
			case <-time.After(profileSegment):
			}
			pprof.StopCPUProfile()
			if f != nil {
				_ = f.Close()
			}
			select {
			case <-stop:
				return
			default:
			}
			f = segment(k)
		}
	}()
	return func() {
		close(stop)
		<-done
		heap, err := os.Create(filepath.Join(dir, fmt.Sprintf("heap-%d.pprof", nodes)))
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = heap.Close() }()
		if err := pprof.Lookup("heap").WriteTo(heap, 0); err != nil {
			t.Error(err)
		}
	}
}

// profileSegment is the length of one CPU profile file of a step.
const profileSegment = 2 * time.Minute

// cpuSeconds is the CPU time (user and system) used so far by this process and by each of
// its children (kube-apiserver, etcd, the controller plugin, csi-provisioner), by command
// name.
func cpuSeconds() map[string]float64 {
	out := map[string]float64{}
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15): fields after the comm's ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != self && ppid != self {
			continue
		}
		comm := s[strings.IndexByte(s, '(')+1 : i]
		if pid == self {
			comm = "benchmark"
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		out[comm] += (ut + st) / 100 // USER_HZ
	}
	return out
}

// cpuShare names the CPU seconds each process used between two cpuSeconds, busiest first.
func cpuShare(before, after map[string]float64) string {
	type kv struct {
		k string
		v float64
	}
	var l []kv
	for k, v := range after {
		if d := v - before[k]; d >= 0.5 {
			l = append(l, kv{k, d})
		}
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	var parts []string
	for _, e := range l {
		parts = append(parts, fmt.Sprintf("%s %.0f s", e.k, e.v))
	}
	return strings.Join(parts, ", ")
}

// TestBenchSettings: the benchmark reads the chart's client settings (a renamed value would
// leave a flag empty or 0) and accounts this process's CPU time. No API server.
func TestBenchSettings(t *testing.T) {
	t.Setenv(envLimits, "chart")
	lim := benchLimits(t)
	for _, f := range append(append([]string{}, lim.plugin...), lim.provisioner...) {
		if strings.HasSuffix(f, "=0") || strings.HasSuffix(f, "=") {
			t.Errorf("flag %s: its chart value is missing", f)
		}
	}
	if len(lim.plugin) != 2 || len(lim.provisioner) != 6 || lim.agentQPS <= 0 || lim.agentBurst <= 0 {
		t.Errorf("chart settings %+v", lim)
	}
	t.Setenv(envLimits, "defaults")
	if lim := benchLimits(t); len(lim.plugin)+len(lim.provisioner) != 0 {
		t.Errorf("defaults pass flags: %+v", lim)
	}
	if _, ok := cpuSeconds()["benchmark"]; !ok {
		t.Errorf("cpuSeconds() = %v, want this process as benchmark", cpuSeconds())
	}
}
