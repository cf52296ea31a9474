package driver

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// waitSuite (in controllerSuite: the fake client and the real kube-apiserver): CreateVolume's
// and DeleteVolume's waits for the node agent watch the volume. While the agent holds the
// volume for a second, the call reads it at most 3 times in all (startDriver's 20 ms poll
// read it some 50 times), and it answers once the agent reports, well before the wait's
// resync read.
func waitSuite(t *testing.T, c client.Client, agent *testAgent) {
	wc, ok := c.(client.WithWatch)
	if !ok {
		t.Fatalf("client %T cannot watch", c)
	}
	const id = "pvc-watched"
	var gets atomic.Int64
	counted := interceptor.NewClient(wc, interceptor.Funcs{
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*v1alpha1.Raid10Volume); ok && key.Name == id {
				gets.Add(1)
			}
			return cl.Get(ctx, key, obj, opts...)
		},
	})
	cc, _ := startDriver(t, counted, 10*time.Second)
	ctx := t.Context()
	held := func(what string, call func() error) {
		t.Helper()
		agent.setHold(true)
		gets.Store(0)
		done := make(chan error, 1)
		go func() { done <- call() }()
		time.Sleep(time.Second)
		n := gets.Load()
		agent.setHold(false)
		released := time.Now()
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n > 3 {
			t.Errorf("%s read the volume %d times in the second the agent held it; want at most 3 (a watch, not a poll)", what, n)
		}
		if d := time.Since(released); d > DefaultWaitResync/2 {
			t.Errorf("%s answered %s after the agent was let go; want the watch's event, not the %s resync", what, d, DefaultWaitResync)
		}
	}
	held("CreateVolume", func() error {
		_, err := cc.CreateVolume(ctx, createReq(id, gib, "node-a"))
		return err
	})
	held("DeleteVolume", func() error {
		_, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	})
}

// watchStore is a KubeStore whose WatchVolume is replaced, counting the watches opened.
type watchStore struct {
	*KubeStore
	opens atomic.Int64
	watch func() (watch.Interface, error)
}

func (s *watchStore) WatchVolume(context.Context, string) (watch.Interface, error) {
	s.opens.Add(1)
	return s.watch()
}

// TestWaitFallbacks: a wait whose watch cannot be opened, ends at once every time, or never
// delivers still sees the agent's report, by reading the volume: every pollInterval (the
// watch that ends is opened again once per interval, not in a loop), or every resync.
func TestWaitFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name      string
		watch     func() (watch.Interface, error)
		resync    time.Duration
		maxOpens  int64
		wantPolls bool // reads every pollInterval, not every resync
	}{
		{"CannotWatch", func() (watch.Interface, error) { return nil, errors.New("no watch here") }, time.Hour, 1, true},
		{"WatchEndsAtOnce", func() (watch.Interface, error) { return watch.NewEmptyWatch(), nil }, time.Hour, 20, true},
		{"WatchSilent", func() (watch.Interface, error) { return watch.NewFake(), nil }, 100 * time.Millisecond, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			fc := fakeClient(t)
			var gets atomic.Int64
			counted := interceptor.NewClient(fc.(client.WithWatch), interceptor.Funcs{
				Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					gets.Add(1)
					return cl.Get(ctx, key, obj, opts...)
				},
			})
			store := &watchStore{KubeStore: NewKubeStore(counted), watch: tc.watch}
			c := &ControllerServer{store: store, locks: &VolumeLocks{}, readyTimeout: 5 * time.Second,
				pollInterval: 20 * time.Millisecond, waitResync: tc.resync}
			vol := &v1alpha1.Raid10Volume{ObjectMeta: metav1.ObjectMeta{Name: "vol-1"}, Spec: v1alpha1.Raid10VolumeSpec{Node: "node-a", SizeBytes: gib}}
			if err := fc.Create(ctx, vol); err != nil {
				t.Fatal(err)
			}
			go func() {
				time.Sleep(300 * time.Millisecond)
				vol.Status.Phase, vol.Status.ObservedGeneration = v1alpha1.VolumePhaseReady, vol.Generation
				if err := fc.Status().Update(ctx, vol); err != nil {
					t.Errorf("status update: %v", err)
				}
			}()
			start := time.Now()
			if _, err := c.waitReady(ctx, "vol-1", gib, false); err != nil {
				t.Fatalf("waitReady: %v", err)
			}
			took := time.Since(start)
			if took > 2*time.Second {
				t.Errorf("waitReady took %s, want the report seen within a read", took)
			}
			if o := store.opens.Load(); o < 1 || o > tc.maxOpens {
				t.Errorf("%d watches opened in %s, want 1 to %d", o, took, tc.maxOpens)
			}
			// 300 ms: some 15 reads at the 20 ms poll, about 3 at a 100 ms resync.
			if g := gets.Load(); tc.wantPolls && g < 5 || !tc.wantPolls && (g < 2 || g > 6) {
				t.Errorf("%d reads of the volume in %s (polling: %v)", g, took, tc.wantPolls)
			}
		})
	}
}
