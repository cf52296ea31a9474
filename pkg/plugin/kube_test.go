package plugin

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/raid10-csi/raid10-csi/pkg/driver"
)

// TestKubeAPIRateLimit: --kube-api-qps and --kube-api-burst reach the client's rate limiter
// (requests against a local HTTP server are spaced by the QPS once the burst is spent); 0
// keeps client-go's defaults; a negative burst is refused naming the flag.
func TestKubeAPIRateLimit(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// elapsed is how long n GETs take through a REST client of o's configuration.
	elapsed := func(o *Options, n int) time.Duration {
		t.Helper()
		cfg, err := restConfig(o)
		if err != nil {
			t.Fatal(err)
		}
		cfg.GroupVersion, cfg.APIPath, cfg.NegotiatedSerializer = &schema.GroupVersion{Version: "v1"}, "/api", scheme.Codecs.WithoutConversion()
		rc, err := rest.RESTClientFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range n {
			if err := rc.Get().AbsPath("/api/v1/namespaces/x").Do(t.Context()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}

	cfg, err := restConfig(&Options{Kubeconfig: kubeconfig, KubeAPIQPS: 40, KubeAPIBurst: 80})
	if err != nil || cfg.QPS != 40 || cfg.Burst != 80 {
		t.Fatalf("restConfig(qps 40, burst 80) = QPS %v, burst %d, %v", cfg.QPS, cfg.Burst, err)
	}
	cfg, err = restConfig(&Options{Kubeconfig: kubeconfig})
	if err != nil || cfg.QPS != 0 || cfg.Burst != 0 {
		t.Fatalf("restConfig(unset) = QPS %v, burst %d, %v; want client-go's defaults (0 in the config)", cfg.QPS, cfg.Burst, err)
	}
	// 10 per second after a burst of 1: 5 requests wait 4 x 100 ms. client-go's default
	// (a burst of 10) and no limit at all send them at once.
	if d := elapsed(&Options{Kubeconfig: kubeconfig, KubeAPIQPS: 10, KubeAPIBurst: 1}, 5); d < 350*time.Millisecond {
		t.Errorf("5 requests at --kube-api-qps=10 --kube-api-burst=1 took %s, want >= 400ms", d)
	}
	if d := elapsed(&Options{Kubeconfig: kubeconfig, KubeAPIQPS: -1, KubeAPIBurst: 1}, 5); d > 300*time.Millisecond {
		t.Errorf("5 requests with --kube-api-qps=-1 took %s, want no client-side wait", d)
	}

	o := Options{Mode: driver.ModeController, Endpoint: "unix:///csi/csi.sock", ReadyTimeout: time.Minute, KubeAPIQPS: -1}
	if err := o.Validate(); err != nil {
		t.Errorf("Validate(--kube-api-qps=-1) = %v, want valid (no client-side limit)", err)
	}
	o.KubeAPIBurst = -1
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--kube-api-burst") {
		t.Errorf("Validate(--kube-api-burst=-1) = %v, want an error naming --kube-api-burst", err)
	}
}
