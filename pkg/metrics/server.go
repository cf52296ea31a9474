package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// NewRegistry returns a registry with the Go runtime and process collectors and, when src
// is not nil, a PoolCollector over it. A process that runs controller-runtime (the node
// plugin) registers its collectors in controller-runtime's registry instead, which has the
// Go and process collectors already: gathering both would report those twice.
func NewRegistry(src Source) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if src != nil {
		reg.MustRegister(NewPoolCollector(src))
	}
	return reg
}

// Check is a readiness check: nil when ready, else an error saying what is missing.
type Check func() error

// Handler serves
//
//	/metrics  what g gathers, in the Prometheus exposition formats
//	/healthz  200 "ok" while the process serves HTTP (liveness)
//	/readyz   200 "ok" when every check passes, else 503 with the first failure
func Handler(g prometheus.Gatherer, ready ...Check) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		for _, c := range ready {
			if err := c(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	return mux
}

// Serve listens on addr and serves Handler(g, ready...) until ctx is done, then shuts
// down gracefully. It returns nil after a shutdown through ctx. While addr is in use it
// retries every listenRetry (logging once) until ctx is done: a node plugin started beside
// its predecessor in one network namespace (on the host, not in a pod of its own) gets the
// address when the predecessor, told to stop, has released it; any other listen error is
// returned at once.
func Serve(ctx context.Context, addr string, g prometheus.Gatherer, ready ...Check) error {
	var l net.Listener
	for logged := false; ; logged = true {
		var err error
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("metrics: listen on %s: %w", addr, err)
		}
		if !logged {
			klog.InfoS("Metrics address in use: retrying until it is free (a predecessor process still serving?)", "address", addr, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(listenRetry):
		}
	}
	return ServeListener(ctx, l, g, ready...)
}

// listenRetry is how often Serve tries an address in use again.
var listenRetry = 250 * time.Millisecond

// ServeListener is Serve on a listener the caller opened (tests use 127.0.0.1:0).
func ServeListener(ctx context.Context, l net.Listener, g prometheus.Gatherer, ready ...Check) error {
	srv := &http.Server{Handler: Handler(g, ready...), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			klog.ErrorS(err, "Metrics server shutdown")
		}
	}()
	klog.InfoS("Serving metrics and health", "address", l.Addr().String())
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		<-done
		return nil
	}
	return fmt.Errorf("metrics: serve: %w", err)
}
