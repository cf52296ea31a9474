package driver

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// countingConfig is cfg with every request counted in n.
func countingConfig(cfg *rest.Config, n *atomic.Int64) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			n.Add(1)
			return rt.RoundTrip(r)
		})
	}
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// capacityFromCache (in TestControllerRealAPIServer): GetCapacity reads from the informer
// cache (CachedStore) once it has synced, so a node's capacity costs the API server no
// request (issue 28: three per node and class each poll before), and the cache follows the
// API server: a volume created on the node lowers the answer as soon as its watch event
// arrives. Before the cache syncs GetCapacity reads the live store, and answers the same.
func capacityFromCache(t *testing.T, c client.Client, cfg *rest.Config) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const node, disk = "cache-node", int64(64 << 30)
	newNode(ctx, t, c, node, 4, disk)

	var liveReqs, cacheReqs atomic.Int64
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	live, err := client.New(countingConfig(cfg, &liveReqs), client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := NewCachedStore(countingConfig(cfg, &cacheReqs), s)
	if err != nil {
		t.Fatal(err)
	}
	ctrl := &ControllerServer{store: NewKubeStore(live), capacity: cs}
	capacity := func() int64 {
		t.Helper()
		resp, err := ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{
			Parameters:         map[string]string{ParamMembers: "4"},
			AccessibleTopology: &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: node}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAvailableCapacity()
	}
	full := disk * 4 / 2

	// Not started: the live store answers.
	if got := capacity(); got != full {
		t.Fatalf("capacity before the cache runs: %d, want %d", got, full)
	}
	if liveReqs.Load() == 0 {
		t.Fatal("GetCapacity before the cache synced made no request to the API server: it did not read the live store")
	}

	done := make(chan error, 1)
	go func() { done <- cs.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("CachedStore.Run: %v", err)
		}
	}()
	waitFor(t, func() bool { _, ok := cs.Store(); return ok })

	liveReqs.Store(0)
	cacheReqs.Store(0)
	for range 20 {
		if got := capacity(); got != full {
			t.Fatalf("capacity from the cache: %d, want %d", got, full)
		}
	}
	if l, k := liveReqs.Load(), cacheReqs.Load(); l != 0 || k != 0 {
		t.Fatalf("20 GetCapacity calls from the synced cache made %d requests on the live client and %d on the cache's, want 0", l, k)
	}

	// A volume the agent has not allocated yet counts against the node once the watch
	// brings it.
	v := &v1alpha1.Raid10Volume{}
	v.Name = "cache-pending"
	v.Spec.Node, v.Spec.SizeBytes, v.Spec.VolumeMode = node, 1<<30, v1alpha1.VolumeModeBlock
	v.Spec.Layout = v1alpha1.Layout{Members: 4, ChunkSizeBytes: DefaultChunkSizeBytes}
	if err := c.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Delete(context.Background(), v) }()
	waitFor(t, func() bool { return capacity() == full-1<<30 })
	if l := liveReqs.Load(); l != 0 {
		t.Fatalf("GetCapacity from the cache made %d requests on the live client, want 0", l)
	}
}

// TestCachedStoreBeforeCRDs: a controller started before the chart's CRDs are served (the
// CRDs applied after the Deployment, an API server that lost them) keeps serving: the cache
// cannot set its informers up and tries again every cacheRetry, Store says it has not
// synced (so GetCapacity reads the API server), and once the CRDs are installed the cache
// syncs by itself and answers from the watch. A Run cancelled while it waits to try again
// returns at once.
func TestCachedStoreBeforeCRDs(t *testing.T) {
	env := kubeenv.Start(t, kubeenv.WithAPIServerFlags("--endpoint-reconciler-type=none"))
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	run := func(ctx context.Context, cs *CachedStore) <-chan error {
		done := make(chan error, 1)
		go func() { done <- cs.Run(ctx) }()
		return done
	}

	cancelled, err := NewCachedStore(env.Config, s)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(t.Context())
	cdone := run(cctx, cancelled)

	cs, err := NewCachedStore(env.Config, s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := run(ctx, cs)
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("CachedStore.Run: %v", err)
		}
	}()

	time.Sleep(time.Second) // the first tries failed: no such kinds
	if _, ok := cs.Store(); ok {
		t.Fatal("Store synced on an API server without the CRDs")
	}
	cancel()
	select {
	case err := <-cdone:
		if err != nil {
			t.Fatalf("Run cancelled before the CRDs: %v, want nil", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run cancelled while waiting to retry did not return within 2 s")
	}

	c, err := client.New(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	env.InstallCRDs(t, crdDir)
	installed := time.Now()
	for {
		if _, ok := cs.Store(); ok {
			break
		}
		if time.Since(installed) > 3*cacheRetry {
			t.Fatalf("the cache did not sync within %v of the CRDs' install", 3*cacheRetry)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("cache synced %v after the CRDs were installed (retry every %v)", time.Since(installed).Round(time.Millisecond), cacheRetry)

	// Reads come from the running informers: a node created now is seen through the watch.
	newNode(ctx, t, c, "late-node", 2, 8<<30)
	store, _ := cs.Store()
	waitFor(t, func() bool {
		n, err := store.GetNode(ctx, "late-node")
		return err == nil && n != nil
	})
}
