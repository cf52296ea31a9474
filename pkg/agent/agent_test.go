package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// crdDir holds the generated CRDs, as the chart ships them.
const crdDir = "../../charts/raid10-csi/crds"

const (
	nodeName   = "node-a"
	diskSize   = 256 << 20
	volumeSize = 64 << 20
	// rebuildRate slows the rebuild of a 64 MiB volume (32 MiB per member) to a few
	// seconds, so that progress is visible in the status.
	rebuildRate = 8 << 20
)

// startAPI runs etcd and kube-apiserver (skipped without `make deps`, failed under CI),
// installs the chart's CRDs and returns a client and the admin's config.
func startAPI(t *testing.T) (client.Client, *rest.Config) {
	t.Helper()
	env := kubeenv.Start(t)
	s, err := agent.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	if names := env.InstallCRDs(t, crdDir); len(names) != 3 {
		t.Fatalf("CRDs in %s: %v, want Raid10Volume, Raid10Node and Raid10Snapshot", crdDir, names)
	}
	ctx := t.Context()
	waitFor(t, time.Minute, "Raid10Volume served", func() bool {
		var l v1alpha1.Raid10VolumeList
		return c.List(ctx, &l) == nil
	})
	return c, env.Config
}

// waitFor polls cond every 20 ms until it holds or timeout passes, and returns how long
// that took.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// makeDisk creates a sparse file of size bytes.
func makeDisk(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// fileDisks makes n sparse file disks of diskSize in dir and returns a pool configuration
// with them.
func fileDisks(t *testing.T, dir string, n int) pool.Config {
	t.Helper()
	var pcfg pool.Config
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		makeDisk(t, p, diskSize)
		pcfg.Disks = append(pcfg.Disks, pool.DiskConfig{Path: p})
	}
	return pcfg
}

func getVolume(t *testing.T, c client.Client, name string) *v1alpha1.Raid10Volume {
	t.Helper()
	var v v1alpha1.Raid10Volume
	if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &v); err != nil {
		t.Fatalf("get Raid10Volume %s: %v", name, err)
	}
	return &v
}

func getNode(c client.Client, ctx context.Context) (*v1alpha1.Raid10Node, error) {
	var n v1alpha1.Raid10Node
	err := c.Get(ctx, client.ObjectKey{Name: nodeName}, &n)
	return &n, err
}

// TestAgentRealAPIServer runs the agent against a real kube-apiserver with the chart's CRDs
// and a pool on four sparse files, through a volume's life: provisioned Ready and Healthy
// with 4/4 members; a failed disk shows Degraded within 2 s; a replacement rebuilds with
// visible progress to Healthy; the Raid10Node's free bytes drop and come back; deleting the
// object frees the extents and the finalizer goes. Events are checked at the end.
func TestAgentRealAPIServer(t *testing.T) {
	c, cfg := startAPI(t)
	ctx := t.Context()

	dir := t.TempDir()
	var pcfg pool.Config
	var paths []string
	for i := range 5 {
		p := filepath.Join(dir, "disk"+string(rune('0'+i))+".img")
		makeDisk(t, p, diskSize)
		paths = append(paths, p)
	}
	for _, p := range paths[:4] {
		pcfg.Disks = append(pcfg.Disks, pool.DiskConfig{Path: p})
	}
	pcfg.RebuildRateMax = rebuildRate
	pl, err := pool.Open(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()

	start := func() (stop func()) {
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- agent.Run(actx, cfg, agent.Options{NodeName: nodeName, Pool: pl}) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent.Run: %v", err)
			}
		}
	}
	stop := start()
	defer func() { stop() }()

	// The Raid10Node appears with the pool's capacity.
	var node *v1alpha1.Raid10Node
	d := waitFor(t, time.Minute, "Raid10Node with capacity", func() bool {
		n, err := getNode(c, ctx)
		node = n
		return err == nil && n.Status.DiskCount == 4 && !n.Status.Capacity.Free.IsZero()
	})
	t.Logf("Raid10Node %s reported in %v: %d/%d disks healthy, raw %s, usable %s, free %s", nodeName, d.Round(time.Millisecond),
		node.Status.HealthyDisks, node.Status.DiskCount, &node.Status.Capacity.Raw, &node.Status.Capacity.Usable, &node.Status.Capacity.Free)
	if node.Status.HealthyDisks != 4 {
		t.Fatalf("healthy disks: %d, want 4", node.Status.HealthyDisks)
	}
	capa := pl.Capacity()
	if got := node.Status.Capacity.Free.Value(); got != int64(capa.LargestVolume) {
		t.Fatalf("free %d, pool's largest volume %d", got, capa.LargestVolume)
	}
	freeBefore := node.Status.Capacity.Free.Value()
	for _, ds := range node.Status.Disks {
		if ds.State != v1alpha1.DiskStateHealthy || ds.FreeBytes <= 0 || ds.SizeBytes != diskSize || ds.ID == "" {
			t.Fatalf("disk status: %+v", ds)
		}
	}

	// A Raid10Volume for this node becomes Ready and Healthy with 4/4 members.
	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: nodeName, SizeBytes: volumeSize, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
	}}
	vol.Name = "pvc-0001"
	vol.Finalizers = []string{v1alpha1.VolumeFinalizer}
	other := vol.DeepCopy()
	other.Name, other.Finalizers, other.Spec.Node = "pvc-other-node", nil, "node-b"
	for _, v := range []*v1alpha1.Raid10Volume{vol, other} {
		if err := c.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	d = waitFor(t, 30*time.Second, "volume Ready", func() bool {
		v := getVolume(t, c, vol.Name)
		return v.Status.Phase == v1alpha1.VolumePhaseReady && v.Status.ObservedGeneration == v.Generation
	})
	got := getVolume(t, c, vol.Name)
	t.Logf("volume Ready in %v: health %s, members %s, capacity %s", d.Round(time.Millisecond), got.Status.Health, got.Status.InSync, got.Status.Capacity)
	if got.Status.Health != v1alpha1.VolumeHealthHealthy || got.Status.InSync != "4/4" || len(got.Status.Members) != 4 ||
		got.Status.Capacity == nil || got.Status.Capacity.Value() < volumeSize {
		t.Fatalf("status after provisioning: %+v", got.Status)
	}
	for _, m := range got.Status.Members {
		if m.State != v1alpha1.MemberStateInSync || m.Disk == "" {
			t.Fatalf("member: %+v", m)
		}
	}
	if _, err := pl.Volume(vol.Name); err != nil {
		t.Fatalf("pool volume: %v", err)
	}
	if _, err := pl.Volume(other.Name); err == nil {
		t.Fatal("the agent provisioned another node's volume")
	}
	// The free bytes dropped before the volume showed its capacity: the controller admits
	// the next request on them.
	if n, err := getNode(c, ctx); err != nil || n.Status.Capacity.Free.Value() >= freeBefore {
		t.Fatalf("Raid10Node free when the volume is Ready: %v (before %d), %v; want it already lower", &n.Status.Capacity.Free, freeBefore, err)
	}

	// A volume larger than the pool: Failed, with the reason the controller maps to
	// ResourceExhausted.
	big := vol.DeepCopy()
	big.Name, big.ResourceVersion, big.Spec.SizeBytes = "pvc-too-big", "", 10<<30
	if err := c.Create(ctx, big); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "too-big volume Failed", func() bool {
		return getVolume(t, c, big.Name).Status.Phase == v1alpha1.VolumePhaseFailed
	})
	if cond := meta.FindStatusCondition(getVolume(t, c, big.Name).Status.Conditions, v1alpha1.ConditionReady); cond == nil ||
		cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.ReasonInsufficientCapacity {
		t.Fatalf("Ready condition of the too-big volume: %+v", cond)
	}
	if err := c.Delete(ctx, big); err != nil {
		t.Fatal(err)
	}

	// A failed disk: Degraded within 2 s.
	if err := pl.FailDisk(paths[1]); err != nil {
		t.Fatal(err)
	}
	failedAt := time.Now()
	d = waitFor(t, 10*time.Second, "Degraded", func() bool {
		return getVolume(t, c, vol.Name).Status.Health == v1alpha1.VolumeHealthDegraded
	})
	t.Logf("Degraded reported %v after FailDisk", d.Round(time.Millisecond))
	if d > 2*time.Second {
		t.Errorf("Degraded took %v, want at most 2s", d)
	}
	got = getVolume(t, c, vol.Name)
	if got.Status.InSync != "3/4" || got.Status.Phase != v1alpha1.VolumePhaseReady {
		t.Fatalf("status after FailDisk: %+v", got.Status)
	}
	waitFor(t, 5*time.Second, "failed disk on the Raid10Node", func() bool {
		n, err := getNode(c, ctx)
		return err == nil && n.Status.HealthyDisks == 3
	})
	t.Logf("Raid10Node shows the failed disk %v after FailDisk", time.Since(failedAt).Round(time.Millisecond))

	// A replacement: Rebuilding with progress, then Healthy.
	if _, err := pl.ReplaceDisk(paths[1], pool.DiskConfig{Path: paths[4]}); err != nil {
		t.Fatal(err)
	}
	var progress []int32
	sawRebuilding := false
	d = waitFor(t, 2*time.Minute, "Healthy after the rebuild", func() bool {
		v := getVolume(t, c, vol.Name)
		if v.Status.Health == v1alpha1.VolumeHealthRebuilding {
			sawRebuilding = true
			if rc := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.ConditionRedundant); rc == nil ||
				rc.Status != metav1.ConditionFalse || rc.Reason != "Rebuilding" {
				t.Errorf("Redundant condition while Rebuilding: %+v", rc)
			}
		}
		if r := v.Status.Rebuild; r != nil && (len(progress) == 0 || progress[len(progress)-1] != r.Percent) {
			progress = append(progress, r.Percent)
			if r.TotalBytes <= 0 || r.StartTime == nil || r.DoneBytes > r.TotalBytes {
				t.Errorf("rebuild progress: %+v", r)
			}
		}
		return v.Status.Health == v1alpha1.VolumeHealthHealthy
	})
	t.Logf("rebuild to Healthy in %v; percent seen: %v", d.Round(time.Millisecond), progress)
	if !sawRebuilding || len(progress) < 2 {
		t.Fatalf("rebuild not visible: Rebuilding seen %v, progress %v", sawRebuilding, progress)
	}
	got = getVolume(t, c, vol.Name)
	if got.Status.InSync != "4/4" || got.Status.Rebuild != nil {
		t.Fatalf("status after the rebuild: %+v", got.Status)
	}
	if rc := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionRedundant); rc == nil || rc.Status != metav1.ConditionTrue {
		t.Fatalf("Redundant condition after the rebuild: %+v", rc)
	}

	// Expansion: spec grows; the array follows, or (while the pool cannot grow it) the
	// phase is Expanding with the reason in the message, and an Event says so.
	got.Spec.SizeBytes = volumeSize * 2
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	expanded := false
	d = waitFor(t, 30*time.Second, "expanded or expansion pending", func() bool {
		v := getVolume(t, c, vol.Name)
		if v.Status.ObservedGeneration != v.Generation {
			return false
		}
		expanded = v.Status.Phase == v1alpha1.VolumePhaseReady && v.Status.Capacity.Value() >= volumeSize*2
		return expanded || v.Status.Phase == v1alpha1.VolumePhaseExpanding
	})
	got = getVolume(t, c, vol.Name)
	t.Logf("after %v: phase %s, capacity %s, message %q", d.Round(time.Millisecond), got.Status.Phase, got.Status.Capacity, got.Status.Message)
	expandEvent := agent.EventExpanded
	if !expanded {
		expandEvent = agent.EventExpandFailed
		if got.Status.Message == "" || got.Status.Health != v1alpha1.VolumeHealthHealthy {
			t.Fatalf("pending expansion: %+v", got.Status)
		}
	}

	// A restart of the agent adopts the volume as it is: same array, same status, no
	// repeated Events.
	stop()
	before := getVolume(t, c, vol.Name)
	beforeUUID := poolUUID(t, pl, vol.Name)
	nEvents := countEvents(t, c)
	stop = start()
	time.Sleep(3 * agent.DefaultPollInterval)
	after := getVolume(t, c, vol.Name)
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("status rewritten after a restart:\nbefore %+v\nafter  %+v", before.Status, after.Status)
	}
	if u := poolUUID(t, pl, vol.Name); u != beforeUUID {
		t.Fatalf("volume recreated after a restart: %s, was %s", u, beforeUUID)
	}
	if n := countEvents(t, c); n != nEvents {
		t.Errorf("%d Events after a restart, %d before", n, nEvents)
	}

	// Delete: the extents are freed and the finalizer removed.
	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	d = waitFor(t, 30*time.Second, "volume gone", func() bool {
		var v v1alpha1.Raid10Volume
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKey{Name: vol.Name}, &v))
	})
	t.Logf("volume object gone %v after Delete", d.Round(time.Millisecond))
	if _, err := pl.Volume(vol.Name); err == nil {
		t.Fatal("pool volume still there after delete")
	}
	if err := pl.Check(); err != nil {
		t.Fatalf("pool check after delete: %v", err)
	}
	waitFor(t, 10*time.Second, "free bytes back", func() bool {
		n, err := getNode(c, ctx)
		return err == nil && n.Status.Capacity.Free.Value() == int64(pl.Capacity().LargestVolume) &&
			pl.Capacity().FreeRaw == pl.Capacity().Raw
	})
	n, _ := getNode(c, ctx)
	t.Logf("Raid10Node free back to %s (largest volume over the 4 active disks)", &n.Status.Capacity.Free)

	// The other node's volume was left alone.
	if o := getVolume(t, c, other.Name); o.Status.Phase != "" || len(o.Finalizers) != 0 {
		t.Fatalf("another node's volume was touched: %+v", o)
	}

	// Events: on the volume and on the node.
	want := map[string]string{
		agent.EventProvisioned: vol.Name, agent.EventDegraded: vol.Name, agent.EventRebuildStarted: vol.Name,
		agent.EventRebuildFinished: vol.Name, expandEvent: vol.Name, agent.EventDeleted: vol.Name,
		agent.EventDiskFailed: nodeName, agent.EventProvisionFailed: big.Name,
	}
	waitFor(t, 10*time.Second, "events", func() bool {
		var l eventsv1.EventList
		if err := c.List(ctx, &l); err != nil {
			return false
		}
		seen := map[string]string{}
		for _, e := range l.Items {
			seen[e.Reason] = e.Regarding.Name
		}
		for r, obj := range want {
			if seen[r] != obj {
				return false
			}
		}
		return true
	})
	var l eventsv1.EventList
	_ = c.List(ctx, &l)
	for _, e := range l.Items {
		t.Logf("event %s/%s %s %s: %s", e.Regarding.Kind, e.Regarding.Name, e.Type, e.Reason, e.Note)
	}
}

func poolUUID(t *testing.T, p *pool.Pool, name string) string {
	t.Helper()
	vi, err := p.Volume(name)
	if err != nil {
		t.Fatal(err)
	}
	return vi.UUID
}

func countEvents(t *testing.T, c client.Client) int {
	t.Helper()
	var l eventsv1.EventList
	if err := c.List(t.Context(), &l); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range l.Items {
		n += max(1, int(e.DeprecatedCount))
		if e.Series != nil {
			n += int(e.Series.Count)
		}
	}
	return n
}
