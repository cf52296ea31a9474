package kubeenv

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// writeSchedulerConfig writes kube-scheduler's KubeSchedulerConfiguration into dir: its
// client uses kubeconfig, and c's non-zero fields are set. It returns the file's path.
func writeSchedulerConfig(dir, kubeconfig string, c SchedulerConfig) (string, error) {
	var b strings.Builder
	b.WriteString("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
	b.WriteString("clientConnection:\n  kubeconfig: " + strconv.Quote(kubeconfig) + "\n")
	if c.QPS > 0 {
		fmt.Fprintf(&b, "  qps: %g\n", c.QPS)
	}
	if c.Burst > 0 {
		fmt.Fprintf(&b, "  burst: %d\n", c.Burst)
	}
	fmt.Fprintf(&b, "enableProfiling: %t\nenableContentionProfiling: false\n", c.Profiling)
	if c.PercentageOfNodesToScore > 0 {
		fmt.Fprintf(&b, "percentageOfNodesToScore: %d\n", c.PercentageOfNodesToScore)
	}
	path := filepath.Join(dir, "kube-scheduler.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("kube-scheduler configuration: %w", err)
	}
	return path, nil
}

// Get reads url from a component of this control plane that serves with a self-signed
// certificate (kube-scheduler's SchedulerURL + "/metrics" or "/debug/pprof/profile"),
// authenticated as the admin. A status other than 200 is an error naming it.
func (e *Env) Get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+e.pki.adminToken)
	resp, err := selfSignedClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}

// selfSignedClient is an HTTP client for this control plane's loopback components that
// serve with a self-signed certificate (kube-controller-manager's and kube-scheduler's): it
// does not verify their certificates.
func selfSignedClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback components' self-signed certificates
	}}
}
