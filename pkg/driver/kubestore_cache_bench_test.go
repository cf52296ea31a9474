package driver

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// BenchmarkCapacityCacheMemory measures the capacity cache's heap per Raid10Volume on a real
// API server (issue 28: the cache is the controller's memory per volume): the same 2,000
// volumes, each with the status an agent writes (four members, health, capacity), cached by
// NewCachedStore (the capacity transform) and, as the reference in the same run, by the same
// informers and index with only the managed fields stripped (the cache before). Run it with
// -benchtime=1x: each iteration builds both caches.
func BenchmarkCapacityCacheMemory(b *testing.B) {
	const n = 2000
	env := kubeenv.Start(b, kubeenv.WithAPIServerFlags("--endpoint-reconciler-type=none"))
	env.InstallCRDs(b, crdDir)
	s := kruntime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		b.Fatal(err)
	}
	cfg := env.Config
	cfg.QPS, cfg.Burst = 500, 1000
	ctx := b.Context()
	// The client maps kinds when it is built: build it once the API server serves the CRDs.
	var c client.Client
	for deadline := time.Now().Add(time.Minute); ; {
		var err error
		if c, err = client.New(cfg, client.Options{Scheme: s}); err == nil {
			if err = c.List(ctx, &v1alpha1.Raid10VolumeList{}); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("Raid10Volume not served: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := range n {
		v := fullVolume(fmt.Sprintf("pvc-%05d", i), fmt.Sprintf("node-%03d", i%100), 1<<30, v1alpha1.VolumePhaseReady, false)
		v.UID, v.ResourceVersion, v.ManagedFields, v.DeletionTimestamp = "", "", nil, nil
		v.Status.Capacity = resource.NewQuantity(1<<30, resource.BinarySI)
		st := v.Status
		if err := c.Create(ctx, &v); err != nil {
			b.Fatal(err)
		}
		v.Status = st
		if err := c.Status().Update(ctx, &v); err != nil {
			b.Fatal(err)
		}
	}
	heap := testenv.HeapAlloc
	// perVolume runs start on a fresh cache until it has synced, and returns the heap it
	// added per volume; the cache stays alive until then.
	perVolume := func(start func(ctx context.Context) (keep any)) float64 {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		before := heap()
		keep := start(cctx)
		after := heap()
		runtime.KeepAlive(keep)
		return float64(after-before) / n
	}
	for range b.N {
		slim := perVolume(func(cctx context.Context) any {
			cs, err := NewCachedStore(cfg, s)
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = cs.Run(cctx) }()
			for {
				if _, ok := cs.Store(); ok {
					break
				}
				runtime.Gosched()
			}
			return cs
		})
		whole := perVolume(func(cctx context.Context) any {
			ch, err := cache.New(cfg, cache.Options{Scheme: s, DefaultTransform: cache.TransformStripManagedFields()})
			if err != nil {
				b.Fatal(err)
			}
			if err := ch.IndexField(cctx, &v1alpha1.Raid10Volume{}, NodeField, func(o client.Object) []string {
				return []string{o.(*v1alpha1.Raid10Volume).Spec.Node}
			}); err != nil {
				b.Fatal(err)
			}
			for _, o := range []client.Object{&v1alpha1.Raid10Volume{}, &v1alpha1.Raid10Snapshot{}, &v1alpha1.Raid10Node{}} {
				if _, err := ch.GetInformer(cctx, o); err != nil {
					b.Fatal(err)
				}
			}
			go func() { _ = ch.Start(cctx) }()
			if !ch.WaitForCacheSync(cctx) {
				b.Fatal("reference cache did not sync")
			}
			return ch
		})
		b.ReportMetric(slim, "B/volume-capacity-cache")
		b.ReportMetric(whole, "B/volume-whole-objects")
		b.ReportMetric(slim/whole, "ratio")
		b.Logf("%d volumes: capacity cache %.0f B per volume, whole objects %.0f B (ratio %.2f)", n, slim, whole, slim/whole)
	}
}
