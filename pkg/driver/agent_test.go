package driver

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// testAgent plays the node agent in controller tests: it reports every Raid10Volume of its
// nodes Ready and Healthy for its generation, takes the volume's size from the node's free
// bytes, and on deletion gives the bytes back and removes the finalizer. It talks to the API
// through the same client as the driver's store, so it works against the fake client and
// against a real kube-apiserver alike.
type testAgent struct {
	c client.Client
	t *testing.T

	mu      sync.Mutex
	hold    bool            // while true, volumes are left as they are (to test waits)
	failAs  string          // when set, new volumes are reported Failed with this reason
	pending string          // when set, growths are reported Expanding with this message
	seen    map[string]bool // volumes whose bytes are taken from their node
	// Snapshots: a new one is cut at once (cutAt, Copying); copying holds the copies of
	// snapshots and of restored or cloned volumes at 40% until it is false again.
	copying    bool
	snapFailAs string // when set, new snapshots are refused with this Ready reason
	snapSeen   map[string]bool
}

func (a *testAgent) setCopying(b bool)         { a.mu.Lock(); a.copying = b; a.mu.Unlock() }
func (a *testAgent) setSnapFail(reason string) { a.mu.Lock(); a.snapFailAs = reason; a.mu.Unlock() }

// reconcileSnapshots cuts, copies and deletes the Raid10Snapshots. Called with a.mu held.
func (a *testAgent) reconcileSnapshots(ctx context.Context) {
	if a.snapSeen == nil {
		a.snapSeen = map[string]bool{}
	}
	var snaps v1alpha1.Raid10SnapshotList
	if err := a.c.List(ctx, &snaps); err != nil {
		return
	}
	for i := range snaps.Items {
		s := &snaps.Items[i]
		st := &s.Status
		switch {
		case s.DeletionTimestamp != nil:
			if a.snapSeen[s.Name] {
				a.take(ctx, s.Spec.Node, 4, -st.SizeBytes)
			}
			s.Finalizers = slices.DeleteFunc(s.Finalizers, func(f string) bool { return f == v1alpha1.VolumeFinalizer })
			if err := a.c.Update(ctx, s); err == nil {
				delete(a.snapSeen, s.Name)
			}
			continue
		case st.Phase == v1alpha1.SnapshotPhaseFailed || st.Phase == v1alpha1.SnapshotPhaseReady:
			continue
		case a.snapFailAs != "" && st.CutAt == nil:
			st.ObservedGeneration, st.Phase, st.Message = s.Generation, v1alpha1.SnapshotPhaseFailed, "test agent refuses it"
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: a.snapFailAs, Message: st.Message})
		default:
			var src v1alpha1.Raid10Volume
			if err := a.c.Get(ctx, client.ObjectKey{Name: s.Spec.Source}, &src); err != nil || src.Status.Capacity == nil {
				continue
			}
			if st.CutAt == nil {
				now := metav1.NewTime(time.Now().Truncate(time.Second))
				st.CutAt, st.SizeBytes = &now, src.Status.Capacity.Value()
				st.Size = resource.NewQuantity(st.SizeBytes, resource.BinarySI)
			}
			st.ObservedGeneration, st.Phase, st.Percent, st.CopiedBytes = s.Generation, v1alpha1.SnapshotPhaseCopying, 40, st.SizeBytes*2/5
			if !a.copying {
				st.Phase, st.ReadyToUse, st.Percent, st.CopiedBytes = v1alpha1.SnapshotPhaseReady, true, 100, st.SizeBytes
			}
		}
		// The node's free bytes drop before the cut shows (see provision).
		cut := st.CutAt != nil && !a.snapSeen[s.Name]
		if cut {
			a.take(ctx, s.Spec.Node, 4, st.SizeBytes)
		}
		if err := a.c.Status().Update(ctx, s); err != nil {
			a.t.Logf("test agent: %v", err)
			if cut {
				a.take(ctx, s.Spec.Node, 4, -st.SizeBytes)
			}
			continue
		}
		if cut {
			a.snapSeen[s.Name] = true
		}
	}
}

// newNode creates a Raid10Node with disks disks of diskBytes each, all free.
func newNode(ctx context.Context, t *testing.T, c client.Client, name string, disks int, diskBytes int64) {
	t.Helper()
	n := &v1alpha1.Raid10Node{}
	n.Name = name
	if err := c.Create(ctx, n); err != nil {
		t.Fatalf("create Raid10Node %s: %v", name, err)
	}
	for i := range disks {
		n.Status.Disks = append(n.Status.Disks, v1alpha1.DiskStatus{
			ID: fmt.Sprintf("%s-disk%d", name, i), Path: fmt.Sprintf("/dev/nvme%dn1", i),
			SizeBytes: diskBytes, FreeBytes: diskBytes, State: v1alpha1.DiskStateHealthy,
		})
	}
	n.Status.DiskCount, n.Status.HealthyDisks = int32(disks), int32(disks)
	setNodeCapacity(n)
	if err := c.Status().Update(ctx, n); err != nil {
		t.Fatalf("update Raid10Node %s status: %v", name, err)
	}
}

func setNodeCapacity(n *v1alpha1.Raid10Node) {
	var raw, free int64
	for _, d := range n.Status.Disks {
		raw += d.SizeBytes
		free += d.FreeBytes
	}
	n.Status.Capacity = v1alpha1.NodeCapacity{
		Raw:    *resource.NewQuantity(raw, resource.BinarySI),
		Usable: *resource.NewQuantity(raw/2, resource.BinarySI),
		Free:   *resource.NewQuantity(free/2, resource.BinarySI),
	}
}

// run reconciles until ctx is done.
func (a *testAgent) run(ctx context.Context) {
	for ctx.Err() == nil {
		a.reconcile(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (a *testAgent) setHold(h bool) { a.mu.Lock(); a.hold = h; a.mu.Unlock() }

func (a *testAgent) setFail(reason string) { a.mu.Lock(); a.failAs = reason; a.mu.Unlock() }

// setPending makes the agent report a growth Expanding with msg, as the real agent does while
// the pool refuses it; "" lets growths through again.
func (a *testAgent) setPending(msg string) { a.mu.Lock(); a.pending = msg; a.mu.Unlock() }

func (a *testAgent) reconcile(ctx context.Context) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hold {
		return
	}
	if a.seen == nil {
		a.seen = map[string]bool{}
	}
	a.reconcileSnapshots(ctx)
	var vols v1alpha1.Raid10VolumeList
	if err := a.c.List(ctx, &vols); err != nil {
		return
	}
	for i := range vols.Items {
		v := &vols.Items[i]
		switch {
		case v.DeletionTimestamp != nil:
			if a.seen[v.Name] {
				a.take(ctx, v.Spec.Node, v.Spec.Layout.Members, -v.Status.Capacity.Value())
			}
			v.Finalizers = slices.DeleteFunc(v.Finalizers, func(f string) bool { return f == v1alpha1.VolumeFinalizer })
			if err := a.c.Update(ctx, v); err == nil {
				delete(a.seen, v.Name)
			}
		case v.Status.Phase == v1alpha1.VolumePhaseFailed:
		case v.Spec.Source != nil && v.Status.Hydration != nil && !v.Status.Hydration.Hydrated && !a.copying:
			v.Status.Hydration = &v1alpha1.HydrationStatus{Hydrated: true, CopiedBytes: v.Spec.SizeBytes, TotalBytes: v.Spec.SizeBytes, Percent: 100}
			if err := a.c.Status().Update(ctx, v); err != nil {
				a.t.Logf("test agent: %v", err)
			}
		case v.Status.ObservedGeneration < v.Generation || v.Status.Phase != v1alpha1.VolumePhaseReady ||
			v.Status.Capacity.Value() < v.Spec.SizeBytes:
			a.provision(ctx, v)
		}
	}
}

func (a *testAgent) provision(ctx context.Context, v *v1alpha1.Raid10Volume) {
	st := &v.Status
	st.ObservedGeneration = v.Generation
	if a.failAs != "" {
		st.Phase = v1alpha1.VolumePhaseFailed
		st.Message = "test agent fails it"
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: a.failAs, Message: st.Message})
		if err := a.c.Status().Update(ctx, v); err != nil {
			a.t.Logf("test agent: %v", err)
		}
		return
	}
	if a.pending != "" && st.Capacity != nil && st.Capacity.Value() < v.Spec.SizeBytes {
		st.Phase, st.Message = v1alpha1.VolumePhaseExpanding, a.pending
		if err := a.c.Status().Update(ctx, v); err != nil {
			a.t.Logf("test agent: %v", err)
		}
		return
	}
	// Like a real node agent, nothing runs for a node that has not reported itself.
	var node v1alpha1.Raid10Node
	if err := a.c.Get(ctx, client.ObjectKey{Name: v.Spec.Node}, &node); err != nil {
		return
	}
	var have int64
	if st.Capacity != nil {
		have = st.Capacity.Value()
	}
	st.Phase, st.Health = v1alpha1.VolumePhaseReady, v1alpha1.VolumeHealthHealthy
	st.Capacity = resource.NewQuantity(v.Spec.SizeBytes, resource.BinarySI)
	st.Members = nil
	for i := range v.Spec.Layout.Members {
		st.Members = append(st.Members, v1alpha1.MemberStatus{Index: i, Disk: fmt.Sprintf("%s-disk%d", v.Spec.Node, i), State: v1alpha1.MemberStateInSync})
	}
	st.InSync = fmt.Sprintf("%d/%d", v.Spec.Layout.Members, v.Spec.Layout.Members)
	st.DevicePath = "/dev/nbd0"
	if v.Spec.Source != nil {
		st.Hydration = &v1alpha1.HydrationStatus{Hydrated: !a.copying, TotalBytes: v.Spec.SizeBytes, CopiedBytes: v.Spec.SizeBytes * 2 / 5, Percent: 40}
		if !a.copying {
			st.Hydration.CopiedBytes, st.Hydration.Percent = v.Spec.SizeBytes, 100
		}
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Provisioned", ObservedGeneration: v.Generation})
	// Like the real agent, the node's free bytes drop before the volume shows its capacity:
	// the controller must never see the allocation without the bytes it took. A provision
	// from a stale list (the test wrote the status meanwhile, as PrinterColumns does)
	// conflicts and gives the bytes back.
	a.take(ctx, v.Spec.Node, v.Spec.Layout.Members, v.Spec.SizeBytes-have)
	if err := a.c.Status().Update(ctx, v); err != nil {
		a.t.Logf("test agent: %v", err)
		a.take(ctx, v.Spec.Node, v.Spec.Layout.Members, have-v.Spec.SizeBytes)
		return
	}
	a.seen[v.Name] = true
}

// take moves usable bytes of the node from free to used (negative: back), spread over the
// first members disks.
func (a *testAgent) take(ctx context.Context, node string, members int32, usable int64) {
	var n v1alpha1.Raid10Node
	// A node created but whose disks are not reported yet (the PrinterColumns test writes
	// them after creating its volume) has nothing to take from.
	if err := a.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil || len(n.Status.Disks) < int(members) {
		return
	}
	per := usable * 2 / int64(members)
	for i := range n.Status.Disks[:members] {
		n.Status.Disks[i].FreeBytes -= per
	}
	setNodeCapacity(&n)
	if err := a.c.Status().Update(ctx, &n); err != nil {
		a.t.Logf("test agent: %v", err)
	}
}
