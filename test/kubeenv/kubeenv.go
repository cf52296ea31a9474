package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// BinDirEnv names the environment variable that holds the directory with the etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl binaries
// (written by hack/build-tools.sh).
const BinDirEnv = "RAID10_KUBE_BIN_DIR"

// ServiceClusterIPRange is the --service-cluster-ip-range of the API server.
const ServiceClusterIPRange = "10.96.0.0/16"

// startTimeout bounds the wait for each process to become ready. The API server is ready in
// about 4 s on an idle 2-core machine; a loaded CI machine can be far slower.
const startTimeout = 3 * time.Minute

// serviceAccountTokenTTL is the lifetime of the tokens ServiceAccountConfig requests: longer
// than any test run.
const serviceAccountTokenTTL = 24 * time.Hour

// Env is a running control plane. Its fields are set by Start and must not be changed;
// copy Config with rest.CopyConfig before altering it.
type Env struct {
	// Config is the admin's client configuration (group system:masters).
	Config *rest.Config
	// Client is a clientset built from Config.
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for the admin, for binaries under test.
	Kubeconfig string
	// Dir holds the logs (<process>.log), certificates, keys and the etcd data.
	Dir string
	// Host is the API server's URL, https://127.0.0.1:<port>.
	Host string
	// StartupTime is how long Start took until everything was ready.
	StartupTime time.Duration
	// AuditLog is the path of the API server's audit log (JSON lines) with WithAudit, or "".
	AuditLog string
	// SchedulerURL is kube-scheduler's secure serving URL (/metrics, and /debug/pprof with
	// SchedulerConfig.Profiling), or "" without WithScheduler. Get reads it.
	SchedulerURL string

	pki   *pki
	procs []*process
}

// Option changes what Start runs.
type Option func(*options)

type options struct {
	controllerManager bool
	controllers       []string // kube-controller-manager's --controllers; empty: its defaults
	kcmFlags          []string // appended to kube-controller-manager's command line
	scheduler         bool
	schedulerConfig   SchedulerConfig
	servingIPs        []net.IP
	apiServerFlags    []string
	auditNamespaces   []string
}

// WithControllerManager also runs kube-controller-manager, for tests that need its
// controllers: the PV binder, service-account and namespace controllers, garbage collection.
func WithControllerManager() Option {
	return func(o *options) { o.controllerManager = true }
}

// WithControllers runs kube-controller-manager with only the named controllers (its
// --controllers names, such as persistentvolume-binder-controller): for a cluster whose
// nodes have no kubelet, where the node lifecycle controller would taint every node.
func WithControllers(names ...string) Option {
	return func(o *options) {
		o.controllerManager = true
		o.controllers = append(o.controllers, names...)
	}
}

// WithControllerManagerFlags appends flags to kube-controller-manager's command line (a
// later flag wins), e.g. its client's --kube-api-qps.
func WithControllerManagerFlags(flags ...string) Option {
	return func(o *options) { o.kcmFlags = append(o.kcmFlags, flags...) }
}

// WithScheduler also runs kube-scheduler, for tests with a kubelet: it binds pods to nodes
// (and, with a WaitForFirstConsumer StorageClass, picks the node of a claim).
func WithScheduler() Option {
	return func(o *options) { o.scheduler = true }
}

// SchedulerConfig is what a test may set of kube-scheduler's KubeSchedulerConfiguration
// (kubescheduler.config.k8s.io/v1); a zero field keeps kube-scheduler's default.
type SchedulerConfig struct {
	// PercentageOfNodesToScore: the share of the feasible nodes after which the scheduler
	// stops filtering (its default is adaptive: 50% less 1% per 125 nodes, at least 5%,
	// and never fewer than 100 nodes).
	PercentageOfNodesToScore int32
	// QPS and Burst of its API client (defaults 50 and 100).
	QPS   float32
	Burst int32
	// Profiling serves /debug/pprof (off by default here).
	Profiling bool
	// Binary is a kube-scheduler to run instead of $RAID10_KUBE_BIN_DIR's: an
	// experiment's build (the scale benchmark's SCHEDULER).
	Binary string
}

// WithSchedulerConfig runs kube-scheduler (as WithScheduler) from a configuration file
// with c's fields set.
func WithSchedulerConfig(c SchedulerConfig) Option {
	return func(o *options) {
		o.scheduler = true
		o.schedulerConfig = c
	}
}

// WithServingIPs adds IP addresses to the API server's serving certificate, besides
// 127.0.0.1: the address a client elsewhere (a VM node reaching the loopback API server
// through a forward) connects to.
func WithServingIPs(ips ...net.IP) Option {
	return func(o *options) { o.servingIPs = append(o.servingIPs, ips...) }
}

// WithAPIServerFlags appends flags to kube-apiserver's command line (a later flag wins).
func WithAPIServerFlags(flags ...string) Option {
	return func(o *options) { o.apiServerFlags = append(o.apiServerFlags, flags...) }
}

// Start runs etcd and kube-apiserver (and kube-controller-manager with
// WithControllerManager), waits until they are ready and registers their shutdown with
// t.Cleanup. Missing binaries end the test through testenv.Missing: a skip, or a failure
// under CI (see the package documentation).
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	bins := []string{"etcd", "kube-apiserver"}
	if o.controllerManager {
		bins = append(bins, "kube-controller-manager")
	}
	if o.scheduler {
		bins = append(bins, "kube-scheduler")
	}
	binPath := findBinaries(t, bins)
	if o.schedulerConfig.Binary != "" {
		binPath["kube-scheduler"] = o.schedulerConfig.Binary
	}

	begin := time.Now()
	// t.TempDir registers its removal first, so it runs after the processes are stopped.
	env := &Env{Dir: t.TempDir()}
	t.Cleanup(func() {
		if t.Failed() {
			logTails(t, env.procs)
		}
		env.stop()
	})
	// From here, on t.Fatalf the cleanup above prints the logs and stops what was started.
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	var err error
	if env.pki, err = newPKI(env.Dir, o.servingIPs...); err != nil {
		t.Fatalf("kubeenv: generate keys: %v", err)
	}
	ports, err := freePorts(5)
	if err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	env.Host = "https://127.0.0.1:" + strconv.Itoa(ports[2])

	// etcd
	phase := time.Now()
	etcd, err := env.start("etcd", binPath["etcd"],
		"--name=kubeenv",
		"--data-dir="+filepath.Join(env.Dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubeenv="+peerURL,
		"--unsafe-no-fsync",
	)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if err := waitHTTP(ctx, etcd, http.DefaultClient, etcdURL+"/health"); err != nil {
		t.Fatalf("kubeenv: etcd not ready: %v", err)
	}
	t.Logf("kubeenv: etcd ready in %v", time.Since(phase).Round(time.Millisecond))

	// kube-apiserver
	phase = time.Now()
	tokens := filepath.Join(env.Dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(env.pki.adminToken+`,admin,admin-uid,"system:masters"`+"\n"), 0o600); err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	apiArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The endpoint reconciler refuses a loopback address; tests need no kubernetes Service endpoints.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--tls-cert-file=" + env.pki.certFile,
		"--tls-private-key-file=" + env.pki.keyFile,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-signing-key-file=" + env.pki.saKeyFile,
		"--service-account-key-file=" + env.pki.saPubFile,
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--allow-privileged=true",
		"--profiling=false",
	}
	if len(o.auditNamespaces) > 0 {
		flags, logPath, err := auditFlags(env.Dir, o.auditNamespaces)
		if err != nil {
			t.Fatalf("%v", err)
		}
		apiArgs = append(apiArgs, flags...)
		env.AuditLog = logPath
	}
	apiserver, err := env.start("kube-apiserver", binPath["kube-apiserver"], append(apiArgs, o.apiServerFlags...)...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	env.Config = &rest.Config{
		Host:            env.Host,
		BearerToken:     env.pki.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.pki.caCertPEM},
		QPS:             100,
		Burst:           200,
	}
	adminHTTP, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	if err := waitHTTP(ctx, apiserver, adminHTTP, env.Host+"/readyz"); err != nil {
		t.Fatalf("kubeenv: kube-apiserver not ready: %v", err)
	}
	if env.Client, err = kubernetes.NewForConfig(env.Config); err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	// /readyz can answer before the system namespaces controller has run once.
	if err := waitFor(ctx, apiserver, func() error {
		_, err := env.Client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatalf("kubeenv: namespace default never appeared: %v", err)
	}
	env.Kubeconfig = filepath.Join(env.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(env.Kubeconfig, env.Config); err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	t.Logf("kubeenv: kube-apiserver ready in %v", time.Since(phase).Round(time.Millisecond))

	// kube-controller-manager
	if o.controllerManager {
		phase = time.Now()
		kcmURL := "https://127.0.0.1:" + strconv.Itoa(ports[3])
		kcm, err := env.start("kube-controller-manager", binPath["kube-controller-manager"],
			append([]string{"--kubeconfig=" + env.Kubeconfig,
				"--authentication-kubeconfig=" + env.Kubeconfig,
				"--authorization-kubeconfig=" + env.Kubeconfig,
				"--bind-address=127.0.0.1",
				"--secure-port=" + strconv.Itoa(ports[3]),
				"--cert-dir=" + filepath.Join(env.Dir, "kube-controller-manager"),
				"--leader-elect=false",
				"--service-account-private-key-file=" + env.pki.saKeyFile,
				"--root-ca-file=" + env.pki.caCertFile,
				"--service-cluster-ip-range=" + ServiceClusterIPRange,
				"--profiling=false",
				"--controllers=" + controllers(o.controllers),
			}, o.kcmFlags...)...,
		)
		if err != nil {
			t.Fatalf("%v", err)
		}
		// Its serving certificate is self-signed in --cert-dir; /healthz is what matters.
		if err := waitHTTP(ctx, kcm, selfSignedClient(), kcmURL+"/healthz"); err != nil {
			t.Fatalf("kubeenv: kube-controller-manager not healthy: %v", err)
		}
		t.Logf("kubeenv: kube-controller-manager healthy in %v", time.Since(phase).Round(time.Millisecond))
	}

	// kube-scheduler
	if o.scheduler {
		phase = time.Now()
		schedURL := "https://127.0.0.1:" + strconv.Itoa(ports[4])
		schedConfig, err := writeSchedulerConfig(env.Dir, env.Kubeconfig, o.schedulerConfig)
		if err != nil {
			t.Fatalf("kubeenv: %v", err)
		}
		sched, err := env.start("kube-scheduler", binPath["kube-scheduler"],
			"--config="+schedConfig,
			"--authentication-kubeconfig="+env.Kubeconfig,
			"--authorization-kubeconfig="+env.Kubeconfig,
			"--bind-address=127.0.0.1",
			"--secure-port="+strconv.Itoa(ports[4]),
			"--leader-elect=false",
		)
		if err != nil {
			t.Fatalf("%v", err)
		}
		if err := waitHTTP(ctx, sched, selfSignedClient(), schedURL+"/healthz"); err != nil {
			t.Fatalf("kubeenv: kube-scheduler not healthy: %v", err)
		}
		env.SchedulerURL = schedURL
		t.Logf("kubeenv: kube-scheduler healthy in %v", time.Since(phase).Round(time.Millisecond))
	}

	env.StartupTime = time.Since(begin)
	t.Logf("kubeenv: control plane at %s ready in %v (logs in %s)", env.Host, env.StartupTime.Round(time.Millisecond), env.Dir)
	return env
}

// ServiceAccountConfig returns a client configuration that authenticates as the existing
// ServiceAccount namespace/name with a token from the TokenRequest API, the way a pod of
// that ServiceAccount would. It fails the test if the ServiceAccount does not exist.
func (e *Env) ServiceAccountConfig(t testing.TB, namespace, name string) *rest.Config {
	t.Helper()
	ttl := int64(serviceAccountTokenTTL / time.Second)
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeenv: token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return e.tokenConfig(tr.Status.Token)
}

// tokenConfig is a client configuration for this control plane that authenticates with
// the bearer token.
func (e *Env) tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            e.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.pki.caCertPEM},
		QPS:             e.Config.QPS,
		Burst:           e.Config.Burst,
	}
}

// ServiceAccountKubeconfig writes a kubeconfig file for the ServiceAccount
// namespace/name (see ServiceAccountConfig) under Dir and returns its path, for a binary
// under test that must run with that ServiceAccount's permissions.
func (e *Env) ServiceAccountKubeconfig(t testing.TB, namespace, name string) string {
	t.Helper()
	path := filepath.Join(e.Dir, fmt.Sprintf("sa-%s-%s.kubeconfig", namespace, name))
	if err := writeKubeconfig(path, e.ServiceAccountConfig(t, namespace, name)); err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	return path
}

// start starts one process with its log under Dir and records it for stop.
func (e *Env) start(name, bin string, args ...string) (*process, error) {
	p, err := startProcess(name, e.Dir, bin, args...)
	if err != nil {
		return nil, err
	}
	e.procs = append(e.procs, p)
	return p, nil
}

// stop stops the processes in the reverse order of their start. It may be called again.
func (e *Env) stop() {
	for i := len(e.procs) - 1; i >= 0; i-- {
		e.procs[i].stop()
	}
}

// findBinaries returns the path of each named binary in $RAID10_KUBE_BIN_DIR. When one is
// missing it ends the test through testenv.Missing (fails under CI, skips otherwise).
func findBinaries(t testing.TB, names []string) map[string]string {
	t.Helper()
	dir := os.Getenv(BinDirEnv)
	paths := make(map[string]string, len(names))
	var missing error
	if dir == "" {
		missing = fmt.Errorf("$%s is not set", BinDirEnv)
	}
	for _, n := range names {
		if missing != nil {
			break
		}
		p := filepath.Join(dir, n)
		if fi, err := os.Stat(p); err != nil {
			missing = err
		} else if fi.Mode()&0o111 == 0 {
			missing = fmt.Errorf("%s is not executable", p)
		}
		paths[n] = p
	}
	if missing == nil {
		return paths
	}
	testenv.Missing(t, "kubeenv: control-plane binaries unavailable (%v); run `make deps` "+
		"(hack/build-tools.sh) and `source hack/tool-env.sh`, or use `make test`", missing)
	return nil
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. They are free when returned;
// another process could take one before the control plane binds it, which then shows as a
// start failure with the port in the process log.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitHTTP polls url with client until it answers 200, p exits, or ctx ends.
func waitHTTP(ctx context.Context, p *process, client *http.Client, url string) error {
	return waitFor(ctx, p, func() error {
		reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
}

// waitFor calls check every 100ms until it returns nil, p exits, or ctx ends; the error
// then says which, with check's last error.
func waitFor(ctx context.Context, p *process, check func() error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		last := check()
		if last == nil {
			return nil
		}
		if done, err := p.exited(); done {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-p.done:
		case <-tick.C:
		}
	}
}

// writeKubeconfig writes a kubeconfig file with the server, CA and bearer token of cfg.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubeenv"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos["kubeenv"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["kubeenv"] = &clientcmdapi.Context{Cluster: "kubeenv", AuthInfo: "kubeenv"}
	kc.CurrentContext = "kubeenv"
	return clientcmd.WriteToFile(*kc, path)
}

// controllers is kube-controller-manager's --controllers value: names, or all of its
// on-by-default controllers.
func controllers(names []string) string {
	if len(names) == 0 {
		return "*"
	}
	return strings.Join(names, ",")
}
