package e2e_test

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// The environment variables with the paths of external-snapshotter's binaries.
const (
	snapshotterEnv        = "RAID10_CSI_SNAPSHOTTER"
	snapshotControllerEnv = "RAID10_SNAPSHOT_CONTROLLER"
)

// snapshotCRDDir holds the snapshot.storage.k8s.io CRDs the chart can install.
const snapshotCRDDir = "../../charts/raid10-csi/charts/snapshot-crds/crds"

var (
	volumeSnapshotGVK        = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshot"}
	volumeSnapshotContentGVK = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotContent"}
)

// snapshotFlow is the real snapshot flow on the host (run by TestRBACLeastPrivilege/SnapshotFlow):
// kube-controller-manager, the real snapshot-controller and csi-snapshotter (external-snapshotter
// v8) with the snapshot CRDs and the chart's VolumeSnapshotClass, the real csi-provisioner, the
// in-process controller and the node agent over four file-backed disks. A VolumeSnapshot of a claim
// becomes ReadyToUse; a claim restored from it binds and holds the data as of the cut although the
// source was written after the cut and during the copy; a claim cloned from a claim holds the
// source's data as of the clone; deletes in every order (a snapshot while its restore still copies
// from it, which waits for the copy; source before its snapshot and clone; restore before its
// snapshot; snapshot before its source) succeed, and the pool, the Raid10Node and the
// CSIStorageCapacity are back where they started.
//
// It runs on cl (a cluster with kube-controller-manager and the snapshot CRDs, see startCluster).
// What it starts stops when t ends; it leaves node-b's Node, CSINode and Raid10Node.
func snapshotFlow(t *testing.T, cl *cluster, prov, snapper, snapCtrl string) {
	const (
		node     = "node-b"
		diskSize = 256 << 20
		size     = 48 << 20
		// The copies run at the rebuild rate: 16 MiB/s makes a 48 MiB copy last about 3 s,
		// long enough to write to the source while its snapshot copies.
		copyRate = 16 << 20
	)
	ctx := t.Context()
	cl.registerNode(t, node)
	pl, _ := filePool(t, 4, 0, diskSize, copyRate)
	cl.startAgent(t, node, pl, 4)
	sock := cl.startController(t, 20*time.Second)
	kubeconfig := cl.env.ServiceAccountKubeconfig(t, namespace, controllerSA)
	provisioner := startSidecar(t, "csi-provisioner", prov,
		[]string{"NAMESPACE=" + namespace, "POD_NAME=raid10-csi-controller-e2e"},
		"--csi-address="+sock, "--kubeconfig="+kubeconfig, "--timeout=30s",
		"--feature-gates=Topology=true", "--enable-capacity=true", "--capacity-ownerref-level=-1",
		"--capacity-poll-interval=2s", "--extra-create-metadata=true", "--default-fstype=ext4",
		"--node-deployment=false", "--leader-election=true", "--leader-election-namespace="+namespace,
		"--retry-interval-start=500ms", "--retry-interval-max=5s", "--v=5")
	// csi-snapshotter with the chart's arguments, as the controller's ServiceAccount.
	snapshotter := startSidecar(t, "csi-snapshotter", snapper, []string{"NAMESPACE=" + namespace},
		"--csi-address="+sock, "--kubeconfig="+kubeconfig, "--timeout=30s", "--extra-create-metadata=true",
		"--feature-gates=CSIVolumeGroupSnapshot=false", "--leader-election=true", "--leader-election-namespace="+namespace,
		"--retry-interval-start=500ms", "--retry-interval-max=5s", "--v=5")
	// The cluster's snapshot-controller (not part of the release by default): as the admin.
	controller := startSidecar(t, "snapshot-controller", snapCtrl, nil,
		"--kubeconfig="+cl.env.Kubeconfig, "--leader-election=false", "--feature-gates=CSIVolumeGroupSnapshot=false",
		"--retry-interval-start=500ms", "--retry-interval-max=5s", "--v=5")
	exited := func() string { return provisioner.exited() + snapshotter.exited() + controller.exited() }

	// The start: the pool's free space, what the Raid10Node and the CSIStorageCapacity say.
	freeAtStart := pl.Capacity()
	capacityIs := func(what string, want int64) {
		t.Helper()
		d := waitFor(t, time.Minute, "CSIStorageCapacity "+what, func() (bool, string) {
			var l storagev1.CSIStorageCapacityList
			if err := cl.c.List(ctx, &l, client.InNamespace(namespace)); err != nil {
				return false, err.Error()
			}
			var got []string
			for _, c := range l.Items {
				if c.StorageClassName == storageClass && c.NodeTopology != nil && c.NodeTopology.MatchLabels[v1alpha1.TopologyNodeKey] == node && c.Capacity != nil {
					if c.Capacity.Value() == want {
						return true, ""
					}
					got = append(got, c.Capacity.String())
				}
			}
			return false, fmt.Sprintf("want %d, have %v%s", want, got, exited())
		})
		t.Logf("CSIStorageCapacity %s: %d MiB after %v", what, want>>20, d.Round(time.Millisecond))
	}
	capacityIs("at the start", int64(freeAtStart.LargestVolume))
	var nodeAtStart v1alpha1.Raid10Node
	if err := cl.c.Get(ctx, client.ObjectKey{Name: node}, &nodeAtStart); err != nil {
		t.Fatal(err)
	}

	sc := storageClass
	claim := func(name string, ds *corev1.TypedLocalObjectReference) *corev1.PersistentVolumeClaim {
		t.Helper()
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault,
				Annotations: map[string]string{selectedNodeAnnotation: node}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &sc,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}},
				DataSource: ds,
			},
		}
		if ds != nil {
			pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ds.APIGroup, Kind: ds.Kind, Name: ds.Name}
		}
		if err := cl.c.Create(ctx, pvc); err != nil {
			t.Fatalf("create PVC %s: %v", name, err)
		}
		key := client.ObjectKeyFromObject(pvc)
		d := waitFor(t, 2*time.Minute, "PVC "+name+" Bound", func() (bool, string) {
			if err := cl.c.Get(ctx, key, pvc); err != nil {
				return false, err.Error()
			}
			return pvc.Status.Phase == corev1.ClaimBound, fmt.Sprintf("phase %s; events: %s%s", pvc.Status.Phase, cl.events(t, pvc.Namespace, pvc.Name), exited())
		})
		t.Logf("PVC %s Bound to %s in %v", name, pvc.Spec.VolumeName, d.Round(time.Millisecond))
		return pvc
	}
	handle := func(pvc *corev1.PersistentVolumeClaim) string {
		t.Helper()
		var pv corev1.PersistentVolume
		if err := cl.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			t.Fatal(err)
		}
		if !nodeAffinityIs(&pv, node) {
			t.Fatalf("PV %s: node affinity %v, want %s", pv.Name, pv.Spec.NodeAffinity, node)
		}
		return pv.Spec.CSI.VolumeHandle
	}
	// The data: written and read through the pool's array of the volume, the engine's I/O
	// path that the node plugin's NBD server serves (no kubelet here mounts it).
	write := func(vol string, off int64, n int) {
		t.Helper()
		a, err := pl.Array(vol)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, n)
		_, _ = rand.Read(b)
		if _, err := a.WriteAt(b, off); err != nil {
			t.Fatalf("write %s: %v", vol, err)
		}
	}
	sum := func(vol string) [32]byte {
		t.Helper()
		a, err := pl.Array(vol)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, size)
		if _, err := a.ReadAt(b, 0); err != nil {
			t.Fatalf("read %s: %v", vol, err)
		}
		return sha256.Sum256(b)
	}
	hydrated := func(vol string) {
		t.Helper()
		d := waitFor(t, time.Minute, vol+" hydrated", func() (bool, string) {
			v, err := cl.getVolume(ctx, vol)
			if err != nil {
				return false, err.Error()
			}
			h := v.Status.Hydration
			return h != nil && h.Hydrated && h.Percent == 100, fmt.Sprintf("%+v", h)
		})
		t.Logf("Raid10Volume %s hydrated after %v", vol, d.Round(time.Millisecond))
	}

	snapshot := func(name, pvc string) (*unstructured.Unstructured, string) {
		t.Helper()
		vs := &unstructured.Unstructured{}
		vs.SetGroupVersionKind(volumeSnapshotGVK)
		vs.SetNamespace(metav1.NamespaceDefault)
		vs.SetName(name)
		vs.Object["spec"] = map[string]any{"volumeSnapshotClassName": storageClass,
			"source": map[string]any{"persistentVolumeClaimName": pvc}}
		if err := cl.c.Create(ctx, vs); err != nil {
			t.Fatalf("create VolumeSnapshot %s: %v", name, err)
		}
		d := waitFor(t, time.Minute, "VolumeSnapshot "+name+" cut", func() (bool, string) {
			if err := cl.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return false, err.Error()
			}
			_, cut, _ := unstructured.NestedString(vs.Object, "status", "creationTime")
			return cut, fmt.Sprintf("status %v; events: %s%s", vs.Object["status"], cl.events(t, vs.GetNamespace(), name), exited())
		})
		content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
		vsc := &unstructured.Unstructured{}
		vsc.SetGroupVersionKind(volumeSnapshotContentGVK)
		if err := cl.c.Get(ctx, client.ObjectKey{Name: content}, vsc); err != nil {
			t.Fatalf("VolumeSnapshotContent %s: %v", content, err)
		}
		id, _, _ := unstructured.NestedString(vsc.Object, "status", "snapshotHandle")
		t.Logf("VolumeSnapshot %s cut after %v: content %s, snapshot %s", name, d.Round(time.Millisecond), content, id)
		return vs, id
	}
	readyToUse := func(vs *unstructured.Unstructured) {
		t.Helper()
		d := waitFor(t, time.Minute, "VolumeSnapshot "+vs.GetName()+" ReadyToUse", func() (bool, string) {
			if err := cl.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return false, err.Error()
			}
			ready, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
			return ready, fmt.Sprintf("status %v%s", vs.Object["status"], exited())
		})
		rs, _, _ := unstructured.NestedString(vs.Object, "status", "restoreSize")
		t.Logf("VolumeSnapshot %s ReadyToUse after %v, restoreSize %s", vs.GetName(), d.Round(time.Millisecond), rs)
	}
	gone := func(what string, obj client.Object) {
		t.Helper()
		d := waitFor(t, 2*time.Minute, what+" gone", func() (bool, string) {
			err := cl.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
			return apierrors.IsNotFound(err), fmt.Sprintf("%v, finalizers %v%s", err, obj.GetFinalizers(), exited())
		})
		t.Logf("%s gone after %v", what, d.Round(time.Millisecond))
	}
	deleteClaim := func(pvc *corev1.PersistentVolumeClaim) {
		t.Helper()
		vol := handle(pvc)
		if err := cl.c.Delete(ctx, pvc); err != nil {
			t.Fatalf("delete PVC %s: %v", pvc.Name, err)
		}
		gone("PVC "+pvc.Name, pvc)
		gone("PV "+pvc.Spec.VolumeName, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvc.Spec.VolumeName}})
		gone("Raid10Volume "+vol, &v1alpha1.Raid10Volume{ObjectMeta: metav1.ObjectMeta{Name: vol}})
		if _, err := pl.Volume(vol); err == nil {
			t.Fatalf("pool volume %s still there after its claim's delete", vol)
		}
	}
	deleteSnapshot := func(vs *unstructured.Unstructured, id string) {
		t.Helper()
		content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
		if err := cl.c.Delete(ctx, vs); err != nil {
			t.Fatalf("delete VolumeSnapshot %s: %v", vs.GetName(), err)
		}
		gone("VolumeSnapshot "+vs.GetName(), vs)
		vsc := &unstructured.Unstructured{}
		vsc.SetGroupVersionKind(volumeSnapshotContentGVK)
		vsc.SetName(content)
		gone("VolumeSnapshotContent "+content, vsc)
		gone("Raid10Snapshot "+id, &v1alpha1.Raid10Snapshot{ObjectMeta: metav1.ObjectMeta{Name: id}})
		if _, err := pl.Snapshot(id); err == nil {
			t.Fatalf("pool snapshot %s still there after its VolumeSnapshot's delete", id)
		}
	}

	// The source claim and its data.
	src := claim("src", nil)
	srcVol := handle(src)
	write(srcVol, 0, size)
	atCut := sum(srcVol)

	// A snapshot; the source is written after the cut, while the snapshot copies.
	vs1, snap1 := snapshot("snap-1", "src")
	var r10s v1alpha1.Raid10Snapshot
	if err := cl.c.Get(ctx, client.ObjectKey{Name: snap1}, &r10s); err != nil {
		t.Fatal(err)
	}
	t.Logf("Raid10Snapshot %s: source %s, node %s, phase %s, %d%% copied, annotations %v", r10s.Name, r10s.Spec.Source, r10s.Spec.Node,
		r10s.Status.Phase, r10s.Status.Percent, r10s.Annotations)
	if r10s.Spec.Source != srcVol || r10s.Spec.Node != node || r10s.Annotations[v1alpha1.VolumeSnapshotNameAnnotation] != "snap-1" {
		t.Fatalf("Raid10Snapshot %s: spec %+v, annotations %v", r10s.Name, r10s.Spec, r10s.Annotations)
	}
	for off := int64(0); off < size; off += 8 << 20 {
		write(srcVol, off, 64<<10)
	}
	readyToUse(vs1)
	row := cl.tableRow(ctx, t, "raid10snapshots", snap1)
	t.Logf("kubectl get r10s %s: %v", snap1, row)
	if row["Ready"] != true || fmt.Sprint(row["Progress"]) != "100" || row["Source"] != srcVol {
		t.Errorf("kubectl get r10s %s: %v, want Ready true, Progress 100, Source %s", snap1, row, srcVol)
	}
	if sum(srcVol) == atCut {
		t.Fatal("the writes after the cut did not change the source")
	}

	// A restore from the snapshot: the data as of the cut.
	restore := claim("restore", &corev1.TypedLocalObjectReference{APIGroup: ptr("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap-1"})
	restoreVol := handle(restore)
	if got := sum(restoreVol); got != atCut {
		t.Fatal("the restored claim does not hold the source's data as of the cut")
	}
	// The snapshot before its restore, while the restore still copies from it: the plugin
	// refuses (FailedPrecondition) until the copy is done, csi-snapshotter retries, then the
	// snapshot goes and the restore keeps its data.
	copying := false
	if v, err := cl.getVolume(ctx, restoreVol); err == nil && v.Status.Hydration != nil && !v.Status.Hydration.Hydrated {
		copying = true
	}
	deleteSnapshot(vs1, snap1)
	t.Logf("VolumeSnapshot snap-1 deleted while its restore was copying: %v", copying)
	hydrated(restoreVol)
	if got := sum(restoreVol); got != atCut {
		t.Fatal("the restored claim, hydrated, does not hold the source's data as of the cut")
	}
	// A snapshot that will outlive its source.
	vs3, snap3 := snapshot("snap-3", "src")
	readyToUse(vs3)

	// A clone of the source claim: its data as of the clone; the source is written after.
	atClone := sum(srcVol)
	clone := claim("clone", &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"})
	cloneVol := handle(clone)
	write(srcVol, 0, 1<<20)
	hydrated(cloneVol)
	if got := sum(cloneVol); got != atClone {
		t.Fatal("the cloned claim does not hold the source's data as of the clone")
	}
	vol, err := cl.getVolume(ctx, cloneVol)
	if err != nil || vol.Spec.Source == nil || vol.Spec.Source.Volume != srcVol || vol.Spec.Node != node {
		t.Fatalf("Raid10Volume %s: %+v, %v; want a clone of %s on %s", cloneVol, vol.Spec, err, srcVol, node)
	}

	// A snapshot of the clone and a restore of it, deleted restore first, then the snapshot
	// before its source.
	vs2, snap2 := snapshot("snap-2", "clone")
	readyToUse(vs2)
	restore2 := claim("restore-2", &corev1.TypedLocalObjectReference{APIGroup: ptr("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap-2"})
	if got := sum(handle(restore2)); got != atClone {
		t.Fatal("the restore of the clone's snapshot does not hold the clone's data")
	}
	deleteClaim(restore2)
	deleteSnapshot(vs2, snap2)

	// The source before its snapshot and its clone.
	deleteClaim(src)
	if got := sum(restoreVol); got != atCut {
		t.Fatal("the restore changed when its source's source went")
	}
	if got := sum(cloneVol); got != atClone {
		t.Fatal("the clone changed when its source went")
	}
	deleteSnapshot(vs3, snap3)
	deleteClaim(restore)
	deleteClaim(clone)

	// Everything is back: pool, Raid10Node, CSIStorageCapacity.
	if got := pl.Capacity(); got.FreeUsable != freeAtStart.FreeUsable || len(pl.Snapshots()) != 0 || len(pl.Volumes()) != 0 {
		t.Fatalf("pool after the deletes: %+v, snapshots %v, volumes %v; at the start %+v", got, pl.Snapshots(), pl.Volumes(), freeAtStart)
	}
	waitFor(t, time.Minute, "Raid10Node free space back", func() (bool, string) {
		var n v1alpha1.Raid10Node
		if err := cl.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, err.Error()
		}
		return n.Status.Capacity.Free.Cmp(nodeAtStart.Status.Capacity.Free) == 0,
			fmt.Sprintf("free %s, at the start %s", n.Status.Capacity.Free.String(), nodeAtStart.Status.Capacity.Free.String())
	})
	capacityIs("after the deletes", int64(freeAtStart.LargestVolume))
}

func ptr[T any](v T) *T { return &v }
