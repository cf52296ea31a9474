package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The API server's way to the kubelet (kubectl logs, exec, port-forward; the e2e suites'
// pod logs and exec): QEMU's user network lets the guest dial out through guestfwd but lets
// no host process reach a guest port. So the node dials in: node.sh keeps a few connections
// to kubeletTunnelAddr open (guestfwd: `socat - UNIX-CONNECT:<guests socket>`), each waiting
// for one byte before it joins the kubelet's port 10250. The API server reaches nodes
// through its egress selector (--egress-selector-config-file, the "cluster" egress: an HTTP
// CONNECT proxy on a unix socket, as for Konnectivity); the proxy pairs each CONNECT with a
// waiting guest connection, sends it the byte and copies both ways. The kubelet's own TLS
// runs through it unchanged.
const (
	// kubeletTunnelAddr is the guestfwd address the node dials (outside the Service range).
	kubeletTunnelAddr = "10.0.2.1:10250"
	// kubeletPort is the kubelet's port in the guest (its default).
	kubeletPort = "10250"
	// tunnelWait is how long a CONNECT waits for a guest connection (the node booting).
	tunnelWait = 30 * time.Second
)

// kubeletTunnel is the host side: guests is the socket the guestfwd command connects to,
// proxy the API server's egress socket.
type kubeletTunnel struct {
	guests, proxy net.Listener
	idle          chan net.Conn
	wg            sync.WaitGroup
}

// startKubeletTunnel listens on dir/kubelet-tunnel.sock (guests) and dir/egress.sock (the API
// server), and writes dir/egress.yaml, the API server's EgressSelectorConfiguration.
func startKubeletTunnel(dir string) (*kubeletTunnel, error) {
	k := &kubeletTunnel{idle: make(chan net.Conn, 64)}
	var err error
	if k.guests, err = net.Listen("unix", filepath.Join(dir, "kubelet-tunnel.sock")); err != nil {
		return nil, fmt.Errorf("cluster: kubelet tunnel: %w", err)
	}
	if k.proxy, err = net.Listen("unix", filepath.Join(dir, "egress.sock")); err != nil {
		_ = k.guests.Close()
		return nil, fmt.Errorf("cluster: kubelet tunnel: %w", err)
	}
	cfg := fmt.Sprintf(egressConfig, k.proxy.Addr().String())
	if err := os.WriteFile(filepath.Join(dir, "egress.yaml"), []byte(cfg), 0o644); err != nil {
		k.Close()
		return nil, err
	}
	k.wg.Add(2)
	go k.acceptGuests()
	go k.serveProxy()
	return k, nil
}

// egressConfig sends the API server's traffic to nodes and pods ("cluster") through the
// tunnel's HTTP CONNECT proxy; etcd and the control plane stay direct.
const egressConfig = `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`

// GuestFwd is the guestfwd command that carries one node connection to the tunnel.
func (k *kubeletTunnel) GuestFwd() string {
	return "socat - UNIX-CONNECT:" + k.guests.Addr().String()
}

// ConfigFile is the API server's --egress-selector-config-file.
func (k *kubeletTunnel) ConfigFile() string {
	return filepath.Join(filepath.Dir(k.proxy.Addr().String()), "egress.yaml")
}

func (k *kubeletTunnel) acceptGuests() {
	defer k.wg.Done()
	for {
		c, err := k.guests.Accept()
		if err != nil {
			return
		}
		select {
		case k.idle <- c:
		default: // more waiting than any API server needs: let the node dial again later
			_ = c.Close()
		}
	}
}

func (k *kubeletTunnel) serveProxy() {
	defer k.wg.Done()
	for {
		c, err := k.proxy.Accept()
		if err != nil {
			return
		}
		go k.connect(c)
	}
}

// connect answers one HTTP CONNECT to the kubelet's port with a guest connection.
func (k *kubeletTunnel) connect(c net.Conn) {
	defer func() { _ = c.Close() }()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\nonly CONNECT\n")
		return
	}
	if _, port, _ := net.SplitHostPort(req.Host); port != kubeletPort {
		// Pods and Services are not reachable from the host (no route into the guest).
		_, _ = fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n\r\nthe rig reaches the kubelet (port %s) only, not %s\n", kubeletPort, req.Host)
		return
	}
	g, err := k.guest()
	if err != nil {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 504 Gateway Timeout\r\n\r\n%v\n", err)
		return
	}
	defer func() { _ = g.Close() }()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(g, br); closeWrite(g); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, g); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

// guest takes a waiting node connection and wakes it (one byte: the node then dials the
// kubelet); a connection that the node has closed meanwhile is skipped.
func (k *kubeletTunnel) guest() (net.Conn, error) {
	deadline := time.After(tunnelWait)
	for {
		select {
		case g := <-k.idle:
			if _, err := g.Write([]byte{'!'}); err == nil {
				return g, nil
			}
			_ = g.Close()
		case <-deadline:
			return nil, errors.New("cluster: no connection from the node's kubelet tunnel (node.sh) in " + tunnelWait.String())
		}
	}
}

func closeWrite(c net.Conn) {
	if u, ok := c.(*net.UnixConn); ok {
		_ = u.CloseWrite()
	}
}

// Close stops both listeners and drops the waiting node connections.
func (k *kubeletTunnel) Close() {
	_ = k.guests.Close()
	_ = k.proxy.Close()
	k.wg.Wait()
	for {
		select {
		case c := <-k.idle:
			_ = c.Close()
		default:
			return
		}
	}
}
