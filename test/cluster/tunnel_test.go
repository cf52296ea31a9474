package cluster

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// TestKubeletTunnel drives the tunnel as the API server and node.sh do, without a VM (a few
// milliseconds): a fake node dials the guests' socket, waits for the byte and joins a TLS
// server standing in for the kubelet; a CONNECT on the egress socket then reaches it, and
// the egress configuration names that socket. A CONNECT to another port is refused.
func TestKubeletTunnel(t *testing.T) {
	kubelet := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "kubelet %s", r.URL.Path)
	}))
	defer kubelet.Close()
	dir, err := os.MkdirTemp("", "tunnel") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	k, err := startKubeletTunnel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	cfg, err := os.ReadFile(k.ConfigFile())
	if err != nil || !strings.Contains(string(cfg), "udsName: "+k.proxy.Addr().String()) {
		t.Fatalf("egress config %s does not name the proxy socket: %v\n%s", k.ConfigFile(), err, cfg)
	}
	if !strings.HasSuffix(k.GuestFwd(), "UNIX-CONNECT:"+k.guests.Addr().String()) {
		t.Fatalf("guestfwd command %q does not dial the guests' socket", k.GuestFwd())
	}
	go fakeNode(t, k.guests.Addr().String(), kubelet.Listener.Addr().String())

	for i := range 3 { // each request takes a new node connection
		body := connectGet(t, k.proxy.Addr().String(), NodeIP+":"+kubeletPort, fmt.Sprintf("/containerLogs/%d", i))
		if want := fmt.Sprintf("kubelet /containerLogs/%d", i); body != want {
			t.Fatalf("through the tunnel: %q, want %q", body, want)
		}
	}
	c, err := net.Dial("unix", k.proxy.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_, _ = fmt.Fprintf(c, "CONNECT 10.244.0.5:80 HTTP/1.1\r\nHost: 10.244.0.5:80\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("CONNECT to a pod's port: %s, want 502", resp.Status)
	}
}

// TestKubeletTunnelAPIServer is `kubectl logs` through the tunnel on a real kube-apiserver
// started with the rig's egress flag (about 5 s, no VM): a Node at the guest's address, a pod
// bound to it, and the pod's log read through the API server, which reaches the fake
// kubelet only through the tunnel (10.0.0.15 is no address of the host).
func TestKubeletTunnelAPIServer(t *testing.T) {
	kubelet := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "kubelet %s", r.URL.Path)
	}))
	defer kubelet.Close()
	dir, err := os.MkdirTemp("", "tunnel")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	k, err := startKubeletTunnel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	env := kubeenv.Start(t, kubeenv.WithAPIServerFlags("--egress-selector-config-file="+k.ConfigFile()))
	go fakeNode(t, k.guests.Addr().String(), kubelet.Listener.Addr().String())

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := env.Client
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeIP}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := c.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{NodeName: NodeName, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := c.CoreV1().Pods("default").GetLogs("p", &corev1.PodLogOptions{Container: "c"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pod log through the API server and the tunnel: %v", err)
	}
	if want := "kubelet /containerLogs/default/p/c"; string(b) != want {
		t.Fatalf("pod log: %q, want %q", b, want)
	}
}

// fakeNode is node.sh's kubelet_tunnel loop: dial, wait for one byte, join the kubelet.
func fakeNode(t *testing.T, guests, kubelet string) {
	for {
		g, err := net.Dial("unix", guests)
		if err != nil {
			return // the tunnel closed
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(g, b); err != nil {
			_ = g.Close()
			return
		}
		go func() {
			defer func() { _ = g.Close() }()
			kc, err := net.Dial("tcp", kubelet)
			if err != nil {
				t.Errorf("fake node: %v", err)
				return
			}
			defer func() { _ = kc.Close() }()
			go func() { _, _ = io.Copy(kc, g) }()
			_, _ = io.Copy(g, kc)
		}()
	}
}

// connectGet sends CONNECT target to the proxy socket, then a GET of path over TLS.
func connectGet(t *testing.T, proxy, target, path string) string {
	t.Helper()
	c, err := net.Dial("unix", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_, _ = fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s: %s", target, resp.Status)
	}
	// The API server checks no kubelet serving certificate (no --kubelet-certificate-authority).
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the kubelet's self-signed certificate, as the API server sees it
	_, _ = fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, target)
	resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatalf("GET %s through the tunnel: %v", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
