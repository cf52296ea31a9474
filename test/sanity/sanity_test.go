package sanity

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csisanity "github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// pluginEnv names the environment variable that gives the guest the plugin binary's path.
const pluginEnv = "RAID10_SANITY_PLUGIN"

// TestSanityVM builds the plugin and runs TestSanityInGuest in the VM.
func TestSanityVM(t *testing.T) {
	vm.Require(t)
	start := time.Now()
	binDir, err := os.MkdirTemp(filepath.Join(vm.CacheDir(), "bin"), "sanity-")
	if err != nil {
		if err := os.MkdirAll(filepath.Join(vm.CacheDir(), "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		if binDir, err = os.MkdirTemp(filepath.Join(vm.CacheDir(), "bin"), "sanity-"); err != nil {
			t.Fatal(err)
		}
	}
	defer os.RemoveAll(binDir)
	plugin := filepath.Join(binDir, "raid10-csi")
	build := exec.Command("go", "build", "-race", "-o", plugin, "github.com/raid10-csi/raid10-csi/cmd/raid10-csi")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/raid10-csi: %v\n%s", err, out)
	}
	t.Logf("plugin built in %s", time.Since(start).Round(time.Second))
	res := vm.RunGoTestOpts(t, vm.Options{Timeout: 20 * time.Minute, Memory: 2048, Env: []string{pluginEnv + "=" + plugin}},
		".", "-test.run=^TestSanityInGuest$", "-test.v", "-test.timeout=18m")
	t.Logf("VM run: boot %s, total %s (with the builds: %s)", res.Boot.Round(time.Second),
		res.Duration.Round(time.Second), time.Since(start).Round(time.Second))
}

// TestSanityInGuest runs csi-sanity against the plugin in --mode=all on four file disks.
func TestSanityInGuest(t *testing.T) {
	if !vm.InGuest() {
		t.Skip("runs in the VM (TestSanityVM)")
	}
	plugin := os.Getenv(pluginEnv)
	if plugin == "" {
		t.Fatalf("%s is not set: run TestSanityVM", pluginEnv)
	}
	dir := t.TempDir()
	var cfg pool.Config
	for i := range 4 {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 256<<20); err != nil {
			t.Fatal(err)
		}
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: p})
	}
	b, _ := json.Marshal(cfg)
	poolConfig := filepath.Join(dir, "pool.json")
	if err := os.WriteFile(poolConfig, b, 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	sock := filepath.Join(dir, "csi.sock")
	const metricsAddr = "127.0.0.1:9810"

	p := startPlugin(t, plugin, "--mode=all", "--node-id=sanity-node", "--endpoint=unix://"+sock,
		"--pool-config="+poolConfig, "--state-dir="+stateDir, "--metrics-address="+metricsAddr,
		"--ready-timeout=30s", "--v=2")
	waitReady(t, p, "http://"+metricsAddr+"/readyz")

	sc := csisanity.NewTestConfig()
	sc.Address = "unix://" + sock
	sc.TargetPath = filepath.Join(dir, "target")
	sc.StagingPath = filepath.Join(dir, "staging")
	sc.TestVolumeSize = 16 << 20
	sc.TestVolumeExpandSize = 32 << 20
	sc.IdempotentCount = 3
	sc.TestNodeVolumeAttachLimit = true
	start := time.Now()
	csisanity.Test(t, sc)
	t.Logf("csi-sanity: %s", time.Since(start).Round(time.Second))
	if t.Failed() {
		p.stop(t)
		return
	}

	// Every volume the suite made is gone, from the records and from the pool.
	var recs struct {
		Version int               `json:"version"`
		Volumes []json.RawMessage `json:"volumes"`
	}
	b, err := os.ReadFile(filepath.Join(stateDir, driver.LocalRecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &recs); err != nil || recs.Version != 1 || len(recs.Volumes) != 0 {
		t.Errorf("records file after the suite: %v: want version 1 and no volume:\n%s", err, b)
	}
	code, body := get("http://" + metricsAddr + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	for _, want := range []string{
		`raid10_csi_operations_total{code="OK",method="CreateVolume"}`,
		`raid10_csi_operations_total{code="OK",method="NodeStageVolume"}`,
		`raid10_csi_operations_total{code="NotFound",method="NodeGetVolumeStats"}`,
		`raid10_pool_largest_volume_bytes{`,
		`raid10_disk_state{disk=`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "raid10_volume_size_bytes{") {
		t.Errorf("/metrics still reports a volume after the suite deleted them all")
	}
	if code, body := get("http://" + metricsAddr + "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the suite: %d %s", code, body)
	}
	p.stop(t)
}

// plugin is the plugin process.
type plugin struct {
	cmd  *exec.Cmd
	done chan error
	mu   sync.Mutex
	tail []string // last lines of its log
}

// startPlugin starts the plugin binary with args, its log going to t.Log (kept short:
// klog lines at -v=2 are one per CSI change) and killed when the test ends.
func startPlugin(t *testing.T, bin string, args ...string) *plugin {
	t.Helper()
	p := &plugin{cmd: exec.Command(bin, args...), done: make(chan error, 1)}
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		_ = w.Close()
		p.done <- err
	}()
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(os.Stderr, "plugin: "+line)
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > 50 {
				p.tail = p.tail[1:]
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
		}
	})
	return p
}

// stop sends SIGTERM and fails t unless the plugin exits with status 0 within 30 s.
func (p *plugin) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("plugin exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Errorf("plugin still running 30 s after SIGTERM")
	}
}

// waitReady waits up to 2 minutes for /readyz to answer 200.
func waitReady(t *testing.T, p *plugin, url string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, body := get(url)
		if code == http.StatusOK {
			return
		}
		select {
		case err := <-p.done:
			p.mu.Lock()
			defer p.mu.Unlock()
			t.Fatalf("plugin exited before it was ready: %v\n%s", err, strings.Join(p.tail, "\n"))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d %q after 2 minutes", url, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// get fetches url; -1 and the error when nothing answers.
func get(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return -1, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
