package plugin

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/metrics"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

func TestValidate(t *testing.T) {
	ok := Options{Mode: driver.ModeController, Endpoint: "unix:///csi/csi.sock", ReadyTimeout: time.Minute, MetricsAddress: ":9810"}
	node := func(m driver.Mode) func(*Options) {
		return func(o *Options) { o.Mode, o.NodeID, o.PoolConfig, o.StateDir = m, "n1", "/etc/pool.json", "/var/lib/x" }
	}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		bad  string // the flag the error must name; empty: valid
	}{
		{"Controller", func(*Options) {}, ""},
		{"Node", node(driver.ModeNode), ""},
		{"All", node(driver.ModeAll), ""},
		{"NoMetrics", func(o *Options) { o.MetricsAddress = "" }, ""},
		{"BadMode", func(o *Options) { o.Mode = "both" }, "--mode"},
		{"NoEndpoint", func(o *Options) { o.Endpoint = "" }, "--endpoint"},
		{"NodeWithoutNodeID", func(o *Options) { node(driver.ModeNode)(o); o.NodeID = "" }, "--node-id"},
		{"NodeWithoutPool", func(o *Options) { node(driver.ModeNode)(o); o.PoolConfig = "" }, "--pool-config"},
		{"NodeWithoutStateDir", func(o *Options) { node(driver.ModeNode)(o); o.StateDir = "" }, "--state-dir"},
		{"AllWithoutNodeID", func(o *Options) { node(driver.ModeAll)(o); o.NodeID = "" }, "--node-id"},
		{"AllWithoutPool", func(o *Options) { node(driver.ModeAll)(o); o.PoolConfig = "" }, "--pool-config"},
		{"AllWithoutStateDir", func(o *Options) { node(driver.ModeAll)(o); o.StateDir = "" }, "--state-dir"},
		{"ZeroTimeout", func(o *Options) { o.ReadyTimeout = 0 }, "--ready-timeout"},
		{"BadMetricsAddress", func(o *Options) { o.MetricsAddress = "9810" }, "--metrics-address"},
		{"MemberTimeout", func(o *Options) { node(driver.ModeNode)(o); o.MemberTimeout = 2 * time.Second }, ""},
		{"MemberTimeoutOff", func(o *Options) { node(driver.ModeAll)(o); o.MemberTimeout = -1 }, ""},
		{"MemberTimeoutOverKernel", func(o *Options) { node(driver.ModeNode)(o); o.MemberTimeout = pool.MaxMemberTimeout }, "--member-timeout"},
		{"MemberTimeoutOverKernelAll", func(o *Options) { node(driver.ModeAll)(o); o.MemberTimeout = time.Hour }, "--member-timeout"},
		{"NegativeHandoverWait", func(o *Options) { node(driver.ModeNode)(o); o.HandoverWait = -time.Second }, "--handover-wait"},
		{"NetlinkNetNS", func(o *Options) { node(driver.ModeNode)(o); o.NetlinkNetNS = "/proc/1/ns/net" }, ""},
		{"RelativeNetlinkNetNS", func(o *Options) { node(driver.ModeNode)(o); o.NetlinkNetNS = "proc/1/ns/net" }, "--netlink-netns"},
		{"NBDMaxRequest", func(o *Options) { node(driver.ModeNode)(o); o.NBDMaxRequestKiB = 1024 }, ""},
		{"NBDMaxRequestKernelDefault", func(o *Options) { node(driver.ModeNode)(o); o.NBDMaxRequestKiB = 0 }, ""},
		{"NBDMaxRequestUnaligned", func(o *Options) { node(driver.ModeNode)(o); o.NBDMaxRequestKiB = 1022 }, "--nbd-max-request-kib"},
		{"NBDMaxRequestTooLarge", func(o *Options) { node(driver.ModeAll)(o); o.NBDMaxRequestKiB = 65536 }, "--nbd-max-request-kib"},
		{"FrontendUblk", func(o *Options) { node(driver.ModeNode)(o); o.Frontend = "ublk" }, ""},
		{"FrontendUnknown", func(o *Options) { node(driver.ModeNode)(o); o.Frontend = "iscsi" }, "--frontend"},
		{"Registration", func(o *Options) { node(driver.ModeNode)(o); o.RegistrationDir = "/var/lib/kubelet/plugins_registry" }, ""},
		{"RegistrationPath", func(o *Options) {
			node(driver.ModeNode)(o)
			o.RegistrationDir, o.KubeletRegistrationPath = "/r", "/var/lib/kubelet/plugins/raid10.csi.io/csi.sock"
		}, ""},
		{"RelativeRegistrationDir", func(o *Options) { node(driver.ModeNode)(o); o.RegistrationDir = "plugins_registry" }, "--registration-dir"},
		{"RegistrationOverTCP", func(o *Options) {
			node(driver.ModeNode)(o)
			o.RegistrationDir, o.Endpoint = "/r", "tcp://127.0.0.1:10000"
		}, "--kubelet-registration-path"},
		{"RelativeRegistrationPath", func(o *Options) {
			node(driver.ModeNode)(o)
			o.RegistrationDir, o.KubeletRegistrationPath = "/r", "csi.sock"
		}, "--kubelet-registration-path"},
		{"RegistrationIgnoredInAllMode", func(o *Options) {
			node(driver.ModeAll)(o)
			o.RegistrationDir, o.Endpoint = "/r", "tcp://127.0.0.1:10000"
		}, ""},
		{"CryptCheap", func(o *Options) {
			node(driver.ModeNode)(o)
			o.Crypt = crypt.Options{PBKDF: "pbkdf2", ForceIterations: 1000}
		}, ""},
		{"CryptUnknownPBKDF", func(o *Options) { node(driver.ModeAll)(o); o.Crypt.PBKDF = "scrypt" }, "--crypt-pbkdf"},
		{"CryptTooFewIterations", func(o *Options) { node(driver.ModeNode)(o); o.Crypt.ForceIterations = 1 }, "--crypt-pbkdf-force-iterations"},
		{"Holder", func(o *Options) { o.Mode, o.StateDir = ModeHolder, "/var/lib/x" }, ""},
		{"HolderWithoutStateDir", func(o *Options) { o.Mode, o.StateDir = ModeHolder, "" }, "--state-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.mod(&o)
			err := o.Validate()
			if tc.bad == "" && err != nil || tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)) {
				t.Fatalf("Validate() = %v, want error naming %q", err, tc.bad)
			}
		})
	}
}

// TestMemberTimeoutFlag: --member-timeout overrides the pool configuration's memberTimeout;
// 0 keeps it.
func TestMemberTimeoutFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool.json")
	if err := os.WriteFile(path, []byte(`{"disks": [], "memberTimeout": "3s"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		flag time.Duration
		want time.Duration
	}{
		{"unset: the file's", 0, 3 * time.Second},
		{"set", 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"off", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := poolConfig(&Options{PoolConfig: path, MemberTimeout: tc.flag})
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(pc.MemberTimeout); got != tc.want {
				t.Fatalf("memberTimeout %s, want %s", got, tc.want)
			}
		})
	}
}

// TestDisksFileInStateDir: the pool records the disks given at run time in --state-dir unless
// the pool configuration names another file, and a replacement onto an unlisted disk made
// through that configuration is found by the next open of it.
func TestDisksFileInStateDir(t *testing.T) {
	dir := t.TempDir()
	disks := vm.SparseFiles(t, dir, "disk", 5, 128<<20)
	cfgPath := filepath.Join(dir, "pool.json")
	b, _ := json.Marshal(map[string]any{"disks": []map[string]string{{"path": disks[0]}, {"path": disks[1]}, {"path": disks[2]}, {"path": disks[3]}}})
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	o := &Options{PoolConfig: cfgPath, StateDir: filepath.Join(dir, "state")}
	pc, err := poolConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(o.StateDir, pool.DisksFileName); pc.DisksFile != want {
		t.Fatalf("disksFile %q, want %q", pc.DisksFile, want)
	}
	p, err := pool.Open(pc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVolume("v", 32<<20, pool.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.FailDisk(disks[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ReplaceDisk(disks[0], pool.DiskConfig{Path: disks[4]}); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	if pc, err = poolConfig(o); err != nil {
		t.Fatal(err)
	}
	if p, err = pool.Open(pc); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	found := false
	for _, d := range p.Disks() {
		found = found || (d.Path == disks[4] && d.Status == pool.StatusActive)
	}
	if !found {
		t.Fatalf("the replacement is not in the pool after a restart: %+v", p.Disks())
	}

	// A disksFile in the configuration is kept.
	if err := os.WriteFile(cfgPath, []byte(`{"disks": [], "disksFile": "/elsewhere/disks.json"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if pc, err = poolConfig(o); err != nil || pc.DisksFile != "/elsewhere/disks.json" {
		t.Fatalf("disksFile %q (%v), want the configuration's", pc.DisksFile, err)
	}
}

// TestNodeModesNeedTheirPool: the node and all modes fail at start-up when the pool
// configuration cannot be read, before touching the kernel or the API server. (Both modes
// run for real in the VM: pkg/driver's node tests, test/sanity for --mode=all.)
func TestNodeModesNeedTheirPool(t *testing.T) {
	for _, m := range []driver.Mode{driver.ModeNode, driver.ModeAll} {
		t.Run(string(m), func(t *testing.T) {
			dir := t.TempDir()
			o := Options{Mode: m, NodeID: "n1", Endpoint: "unix://" + dir + "/csi.sock", ReadyTimeout: time.Second,
				PoolConfig: dir + "/missing.json", StateDir: dir, Kubeconfig: writeKubeconfig(t)}
			err := Run(context.Background(), &o)
			if err == nil || !strings.Contains(err.Error(), "read config") {
				t.Fatalf("Run(--mode=%s) = %v, want the pool config error", m, err)
			}
		})
	}
}

// writeKubeconfig writes a kubeconfig naming an API server that does not answer: the
// controller's client is built lazily, so the plugin starts, and any call to the store fails.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	const cfg = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// freeAddr returns a 127.0.0.1 address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// get fetches url and returns the status code and body; -1 when nothing answers.
func get(url string) (int, string) {
	resp, err := http.Get(url) //nolint:noctx // a test against a local server
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestControllerModeMetrics starts Run in --mode=controller with --metrics-address and checks
// the HTTP side: /readyz is ok once the CSI endpoint serves, /metrics counts the CSI calls by
// method and code (as the client got them) and has no pool metrics (no pool in this mode),
// and Run returns nil after ctx ends.
func TestControllerModeMetrics(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	sock := filepath.Join(dir, "csi.sock")
	o := Options{Mode: driver.ModeController, Endpoint: "unix://" + sock, ReadyTimeout: time.Second,
		Kubeconfig: writeKubeconfig(t), MetricsAddress: addr}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, &o) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get("http://" + addr + "/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %q after 30 s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := get("http://" + addr + "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d %q", code, body)
	}

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := csi.NewControllerClient(conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{}); err == nil {
		t.Fatal("DeleteVolume without a volume ID succeeded")
	}
	code, body := get("http://" + addr + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`raid10_csi_operations_total{code="OK",method="GetPluginInfo"} 1`,
		`raid10_csi_operations_total{code="InvalidArgument",method="DeleteVolume"} 1`,
		`raid10_csi_operation_duration_seconds_count{code="OK",method="GetPluginInfo"} 1`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "raid10_pool_") {
		t.Errorf("/metrics of the controller has pool metrics")
	}
}

// TestRegistryPerMode: every mode's registry gathers without error (no metric reported
// twice: in node mode controller-runtime's registry already has the Go and process
// collectors) and has the pool's metrics exactly where there is a pool.
func TestRegistryPerMode(t *testing.T) {
	dir := t.TempDir()
	var cfg pool.Config
	for i := range 2 {
		p := filepath.Join(dir, "disk"+strconv.Itoa(i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 64<<20); err != nil {
			t.Fatal(err)
		}
		cfg.Disks = append(cfg.Disks, pool.DiskConfig{Path: p})
	}
	p, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	io := fakeIO{"vol-1": nbd.Stats{Read: nbd.OpStats{Requests: 3, Bytes: 12288}}}
	for _, tc := range []struct {
		mode driver.Mode
		src  metrics.Source
		io   metrics.IOSource
	}{{driver.ModeController, nil, nil}, {driver.ModeAll, p, io}, {driver.ModeNode, p, io}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			reg, err := registry(tc.mode, tc.src, tc.io)
			if err != nil {
				t.Fatal(err)
			}
			m, err := metrics.NewCSIMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			m.Observe("/csi.v1.Identity/Probe", nil, time.Millisecond)
			families, err := reg.Gather()
			if err != nil {
				t.Fatalf("Gather: %v", err)
			}
			names := map[string]bool{}
			for _, f := range families {
				names[f.GetName()] = true
			}
			if !names["go_goroutines"] || !names["raid10_csi_operations_total"] {
				t.Errorf("gathered %d families without go_goroutines or raid10_csi_operations_total", len(families))
			}
			if names["raid10_pool_raw_bytes"] != (tc.src != nil) {
				t.Errorf("raid10_pool_raw_bytes gathered: %v, want %v", names["raid10_pool_raw_bytes"], tc.src != nil)
			}
			if names["raid10_volume_requests_total"] != (tc.io != nil) {
				t.Errorf("raid10_volume_requests_total gathered: %v, want %v", names["raid10_volume_requests_total"], tc.io != nil)
			}
		})
	}
}

// fakeIO is a metrics.IOSource with fixed counters.
type fakeIO map[string]nbd.Stats

func (f fakeIO) IOStats() map[string]nbd.Stats { return f }

// TestRegistrationPath: the endpoint reported to the kubelet is --kubelet-registration-path,
// else the path of a unix --endpoint, else nothing (Validate refuses that in node mode).
func TestRegistrationPath(t *testing.T) {
	for _, tc := range []struct{ endpoint, flag, want string }{
		{"unix:///var/lib/kubelet/plugins/raid10.csi.io/csi.sock", "", "/var/lib/kubelet/plugins/raid10.csi.io/csi.sock"},
		{"unix:///csi/csi.sock", "/var/lib/kubelet/plugins/raid10.csi.io/csi.sock", "/var/lib/kubelet/plugins/raid10.csi.io/csi.sock"},
		{"tcp://127.0.0.1:10000", "", ""},
	} {
		o := Options{Endpoint: tc.endpoint, KubeletRegistrationPath: tc.flag}
		if got := o.registrationPath(); got != tc.want {
			t.Errorf("endpoint %q, flag %q: %q, want %q", tc.endpoint, tc.flag, got, tc.want)
		}
	}
}
