package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/driver"
)

func TestValidate(t *testing.T) {
	ok := Options{Mode: driver.ModeController, Endpoint: "unix:///csi/csi.sock", ReadyTimeout: time.Minute}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		bad  string // the flag the error must name; empty: valid
	}{
		{"Controller", func(*Options) {}, ""},
		{"BadMode", func(o *Options) { o.Mode = "both" }, "--mode"},
		{"NoEndpoint", func(o *Options) { o.Endpoint = "" }, "--endpoint"},
		{"NodeWithoutNodeID", func(o *Options) { o.Mode = driver.ModeNode }, "--node-id"},
		{"NodeWithoutPool", func(o *Options) { o.Mode, o.NodeID, o.StateDir = driver.ModeNode, "n1", "/var/lib/x" }, "--pool-config"},
		{"NodeWithoutStateDir", func(o *Options) { o.Mode, o.NodeID, o.PoolConfig = driver.ModeNode, "n1", "/etc/pool.json" }, "--state-dir"},
		{"ZeroTimeout", func(o *Options) { o.ReadyTimeout = 0 }, "--ready-timeout"},
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

// TestNodeModeNeedsItsPool: the node mode fails at start-up when its pool configuration
// cannot be read, before touching the kernel or the API server. (The node service itself is
// tested in pkg/driver, in the VM.)
func TestNodeModeNeedsItsPool(t *testing.T) {
	dir := t.TempDir()
	o := Options{Mode: driver.ModeNode, NodeID: "n1", Endpoint: "unix://" + dir + "/csi.sock", ReadyTimeout: time.Second,
		PoolConfig: dir + "/missing.json", StateDir: dir}
	err := Run(context.Background(), &o)
	if err == nil || !strings.Contains(err.Error(), "read config") {
		t.Fatalf("Run(--mode=node) = %v, want the pool config error", err)
	}
}

// TestAllModeSaysNotBuilt: the standalone mode must fail loudly, never pretend to serve.
func TestAllModeSaysNotBuilt(t *testing.T) {
	o := Options{Mode: driver.ModeAll, NodeID: "n1", Endpoint: "unix://" + t.TempDir() + "/csi.sock", ReadyTimeout: time.Second}
	err := Run(context.Background(), &o)
	if err == nil || !strings.Contains(err.Error(), "not built yet") {
		t.Fatalf("Run(--mode=all) = %v, want a not-built error", err)
	}
}
