package driver

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// CachedStore is GetCapacity's reader in a cluster (CapacityReads): a KubeStore whose reads
// come from an informer cache of the Raid10Nodes, Raid10Volumes and Raid10Snapshots
// (controller-runtime's cache, the volumes and snapshots indexed by spec.node). The
// provisioner's capacity tracking asks GetCapacity for every node and class each poll; read
// from the API server a node's answer costs three requests (its Raid10Node, its volumes and
// its snapshots), 200 requests a second at 1,000 nodes (issue 28). From the cache it costs
// none: the informers' watches bring every change, so the answer is as fresh as the watch.
// The cache holds every object of the three kinds without their managed fields.
type CachedStore struct {
	cache   cache.Cache
	store   *KubeStore
	synced  atomic.Bool
	indexed int // Run's: the spec.node indexes registered so far (each can be registered once)
}

var _ CapacityReads = (*CachedStore)(nil)

// NewCachedStore builds the cache on cfg (scheme must hold v1alpha1); Run starts it.
func NewCachedStore(cfg *rest.Config, scheme *runtime.Scheme) (*CachedStore, error) {
	ch, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("capacity cache: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: ch}})
	if err != nil {
		return nil, fmt.Errorf("capacity cache: client: %w", err)
	}
	return &CachedStore{cache: ch, store: NewKubeStore(c)}, nil
}

// cacheRetry is how long Run waits before it tries again to set the informers up (the CRDs
// not installed yet, the API server not reachable).
const cacheRetry = 5 * time.Second

// Run sets the informers up (retrying until the kinds are served), runs them until ctx
// ends, and lets Store answer once they have synced. GetCapacity reads the live store
// meanwhile, so a controller started before its CRDs still serves.
func (s *CachedStore) Run(ctx context.Context) error {
	for {
		err := s.informers(ctx)
		if err == nil {
			break
		}
		klog.InfoS("Capacity cache not set up yet; GetCapacity reads the API server meanwhile", "err", err, "retry", cacheRetry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(cacheRetry):
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- s.cache.Start(ctx) }()
	if s.cache.WaitForCacheSync(ctx) {
		s.synced.Store(true)
		klog.InfoS("Capacity cache synced: GetCapacity reads Raid10Nodes, Raid10Volumes and Raid10Snapshots from it")
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("capacity cache: %w", err)
	}
	return nil
}

// informers registers the spec.node indexes (whose name is the field KubeStore's node-scoped
// lists select on) that are not registered yet, and the three informers (GetInformer of one
// that exists returns it).
func (s *CachedStore) informers(ctx context.Context) error {
	byNode := []struct {
		obj client.Object
		f   client.IndexerFunc
	}{
		{&v1alpha1.Raid10Volume{}, func(o client.Object) []string { return []string{o.(*v1alpha1.Raid10Volume).Spec.Node} }},
		{&v1alpha1.Raid10Snapshot{}, func(o client.Object) []string { return []string{o.(*v1alpha1.Raid10Snapshot).Spec.Node} }},
	}
	for _, b := range byNode[s.indexed:] {
		if err := s.cache.IndexField(ctx, b.obj, NodeField, b.f); err != nil {
			return fmt.Errorf("index %T by %s: %w", b.obj, NodeField, err)
		}
		s.indexed++
	}
	if _, err := s.cache.GetInformer(ctx, &v1alpha1.Raid10Node{}); err != nil {
		return fmt.Errorf("Raid10Node informer: %w", err)
	}
	return nil
}

// Store implements CapacityReads.
func (s *CachedStore) Store() (VolumeStore, bool) {
	return s.store, s.synced.Load()
}
