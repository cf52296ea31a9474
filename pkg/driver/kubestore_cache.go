package driver

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// The cache holds every Raid10Node without its managed fields, and of every Raid10Volume and
// Raid10Snapshot only the fields that GetCapacity reads (capacityVolume, capacitySnapshot):
// the cache is the controller's only per-volume memory, and a whole volume (status,
// members, conditions) cost 10 KiB of heap each, a gigabyte at 100,000 volumes (issue 28).
// So its Store is GetCapacity's alone: nothing else may read those objects through it.
type CachedStore struct {
	cache   cache.Cache
	store   *KubeStore
	synced  atomic.Bool
	indexed int // Run's: the spec.node indexes registered so far (each can be registered once)
}

var _ CapacityReads = (*CachedStore)(nil)

// NewCachedStore builds the cache on cfg (scheme must hold v1alpha1); Run starts it.
func NewCachedStore(cfg *rest.Config, scheme *runtime.Scheme) (*CachedStore, error) {
	// One default transform for the three kinds, not cache.ByObject: ByObject maps each
	// kind to its resource when the cache is built, which fails before the CRDs are served.
	ch, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultTransform: capacityTransform})
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

// capacityMeta keeps of an object's metadata what the cache and nodeFree need: the key
// (namespace, name), the identity and version, and the deletion mark.
func capacityMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         m.Namespace,
		UID:               m.UID,
		ResourceVersion:   m.ResourceVersion,
		Generation:        m.Generation,
		DeletionTimestamp: m.DeletionTimestamp,
	}
}

// stripManagedFields is controller-runtime's transform that drops metadata.managedFields.
var stripManagedFields = cache.TransformStripManagedFields()

// capacityTransform is the cache's transform: Raid10Volumes and Raid10Snapshots slimmed to
// what GetCapacity reads, any other object (the Raid10Nodes) without its managed fields.
func capacityTransform(obj any) (any, error) {
	switch obj.(type) {
	case *v1alpha1.Raid10Volume:
		return capacityVolume(obj)
	case *v1alpha1.Raid10Snapshot:
		return capacitySnapshot(obj)
	}
	return stripManagedFields(obj)
}

// capacityVolume is the cache's transform of a Raid10Volume: only what nodeFree reads
// (spec.node, spec.sizeBytes, spec.layout, status.phase, status.capacity) is kept. Other
// objects pass through unchanged; applied twice it gives the same object.
func capacityVolume(obj any) (any, error) {
	v, ok := obj.(*v1alpha1.Raid10Volume)
	if !ok {
		return obj, nil
	}
	return &v1alpha1.Raid10Volume{
		TypeMeta:   v.TypeMeta,
		ObjectMeta: capacityMeta(&v.ObjectMeta),
		Spec:       v1alpha1.Raid10VolumeSpec{Node: v.Spec.Node, SizeBytes: v.Spec.SizeBytes, Layout: v.Spec.Layout},
		Status:     v1alpha1.Raid10VolumeStatus{Phase: v.Status.Phase, Capacity: v.Status.Capacity},
	}, nil
}

// capacitySnapshot is the cache's transform of a Raid10Snapshot: only what nodeFree reads
// (spec.node, spec.source, status.phase, status.cutAt) is kept.
func capacitySnapshot(obj any) (any, error) {
	s, ok := obj.(*v1alpha1.Raid10Snapshot)
	if !ok {
		return obj, nil
	}
	return &v1alpha1.Raid10Snapshot{
		TypeMeta:   s.TypeMeta,
		ObjectMeta: capacityMeta(&s.ObjectMeta),
		Spec:       v1alpha1.Raid10SnapshotSpec{Node: s.Spec.Node, Source: s.Spec.Source},
		Status:     v1alpha1.Raid10SnapshotStatus{Phase: s.Status.Phase, CutAt: s.Status.CutAt},
	}, nil
}
