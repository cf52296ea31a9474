package plugin

import (
	"context"
	"sync"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/metrics"
)

// standby serves /healthz and /readyz (both 200) and the process metrics on
// --metrics-address while a node plugin waits for its predecessor to hand it the devices (a
// surge update: the old pod serves until the DaemonSet sees this one Ready and deletes it).
// Ready here means ready to take over: the arrays are still the predecessor's, and this
// process opens nothing until they come. The plugin's own metrics server replaces it once
// they did (stop, then metrics.Serve on the same address).
type standby struct {
	addr string

	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
}

// start serves until stop; it does nothing without an address or when called again. The
// address may still be the predecessor's when both run in one network namespace (a plugin
// run on the host): metrics.Serve waits for it.
func (s *standby) start() {
	if s.addr == "" {
		return
	}
	s.once.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		s.cancel, s.done = cancel, make(chan struct{})
		go func() {
			defer close(s.done)
			if err := metrics.Serve(ctx, s.addr, metrics.NewRegistry(nil)); err != nil {
				klog.ErrorS(err, "Standby health endpoint")
			}
		}()
	})
}

// stop ends the serving begun by start, if any, and returns once the address is free.
func (s *standby) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
}
