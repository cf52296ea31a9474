package e2e_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// selectedNodeAnnotation is what kube-scheduler writes on a WaitForFirstConsumer claim when
// it has picked the node of the claim's first pod.
const selectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// pvcFlow is the real claim flow on the host (run by TestRBACLeastPrivilege/PVCFlow): kube-
// controller-manager's PV controller, the real csi-provisioner (capacity tracking on) against the
// in-process controller, the node agent over four file-backed disks. A claim with the scheduler's
// selected-node annotation becomes Bound to a PV whose Raid10Volume is Ready and Healthy, with its
// VolumeAttributesClass's QoS limits in force; moved to another class, the real csi-resizer
// modifies the volume (ControllerModifyVolume) and both classes' limits hold; a larger request is
// expanded by the real csi-resizer (the array grows, the PV follows; the filesystem step waits for
// a kubelet); the CSIStorageCapacity of the node's topology segment equals the pool's largest
// volume throughout: before, lower after provisioning and again after the expansion, and back when
// the claim is deleted (reclaim Delete removes the PV, the Raid10Volume and the extents). Last,
// an encrypted claim's key flow (encryptedClaim).
//
// It runs on cl, a cluster with kube-controller-manager, with the csi-provisioner and csi-resizer
// binaries prov and resizer. What it starts stops when t ends; the objects it leaves are those of
// node-a (Node, CSINode, Raid10Node).
func pvcFlow(t *testing.T, cl *cluster, prov, resizer string) {
	const (
		node     = "node-a"
		diskSize = 256 << 20
		claimed  = 64 << 20
	)
	ctx := t.Context()

	// The chart's CSIDriver and StorageClass are what this flow relies on.
	var drv storagev1.CSIDriver
	if err := cl.c.Get(ctx, client.ObjectKey{Name: v1alpha1.DriverName}, &drv); err != nil {
		t.Fatalf("CSIDriver from %s: %v", manifest, err)
	}
	if drv.Spec.AttachRequired == nil || *drv.Spec.AttachRequired || drv.Spec.StorageCapacity == nil || !*drv.Spec.StorageCapacity {
		t.Fatalf("CSIDriver %s: attachRequired %v, storageCapacity %v; want false, true", drv.Name, drv.Spec.AttachRequired, drv.Spec.StorageCapacity)
	}
	var sc storagev1.StorageClass
	if err := cl.c.Get(ctx, client.ObjectKey{Name: storageClass}, &sc); err != nil {
		t.Fatalf("StorageClass from %s: %v", manifest, err)
	}
	if sc.Provisioner != v1alpha1.DriverName || sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer ||
		sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion || sc.ReclaimPolicy == nil || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Fatalf("StorageClass %s: %+v, want provisioner %s, WaitForFirstConsumer, expansion allowed, reclaim Delete", sc.Name, sc, v1alpha1.DriverName)
	}
	t.Logf("StorageClass %s parameters: %v", sc.Name, sc.Parameters)

	cl.registerNode(t, node)
	pl, _ := filePool(t, 4, 0, diskSize, 0)
	cl.startAgent(t, node, pl, 4)
	sock := cl.startController(t, 20*time.Second)

	// csi-provisioner with the chart's arguments (controller.yaml), except: no Pod owns the
	// CSIStorageCapacity objects (-1, no POD_NAME lookup); short retries; capacity polled
	// every 2 s instead of every minute. The provisioner refreshes a segment itself right
	// after CreateVolume and DeleteVolume, but nothing refreshes it after an expansion by
	// csi-resizer: with the chart's 1 m that step waited 59 s for the next poll.
	kubeconfig := cl.env.ServiceAccountKubeconfig(t, namespace, controllerSA)
	provisioner := startSidecar(t, "csi-provisioner", prov,
		[]string{"NAMESPACE=" + namespace, "POD_NAME=raid10-csi-controller-e2e"},
		"--csi-address="+sock,
		"--kubeconfig="+kubeconfig,
		"--timeout=30s",
		"--feature-gates=Topology=true",
		"--enable-capacity=true",
		"--capacity-ownerref-level=-1",
		"--capacity-poll-interval=2s",
		"--extra-create-metadata=true",
		"--default-fstype=ext4",
		"--node-deployment=false",
		"--leader-election=true",
		"--leader-election-namespace="+namespace,
		"--retry-interval-start=500ms",
		"--retry-interval-max=5s",
		"--v=5",
	)

	// csi-resizer with the chart's arguments.
	resizerProc := startSidecar(t, "csi-resizer", resizer,
		[]string{"NAMESPACE=" + namespace},
		"--csi-address="+sock,
		"--kubeconfig="+kubeconfig,
		"--timeout=30s",
		"--leader-election=true",
		"--leader-election-namespace="+namespace,
		"--retry-interval-start=500ms",
		"--retry-interval-max=5s",
		"--v=5",
	)

	// capacityNow waits until the provisioner's CSIStorageCapacity for the chart's class
	// and the node's segment shows what the pool says its largest volume is now.
	capacityNow := func(what string) int64 {
		t.Helper()
		var state string
		var got int64
		d := waitFor(t, time.Minute, "CSIStorageCapacity "+what, func() (bool, string) {
			want := int64(pl.Capacity().LargestVolume)
			var l storagev1.CSIStorageCapacityList
			if err := cl.c.List(ctx, &l, client.InNamespace(namespace)); err != nil {
				return false, err.Error() + provisioner.exited()
			}
			var mine []storagev1.CSIStorageCapacity
			var all []string
			for _, c := range l.Items {
				all = append(all, fmt.Sprintf("%s: class %s, topology %v, capacity %v, max %v", c.Name, c.StorageClassName, c.NodeTopology, c.Capacity, c.MaximumVolumeSize))
				if c.StorageClassName == storageClass && c.NodeTopology != nil && len(c.NodeTopology.MatchLabels) == 1 &&
					c.NodeTopology.MatchLabels[v1alpha1.TopologyNodeKey] == node {
					mine = append(mine, c)
				}
			}
			state = fmt.Sprintf("pool's largest volume %d; CSIStorageCapacity in %s: %v%s", want, namespace, all, provisioner.exited())
			if len(mine) != 1 || mine[0].Capacity == nil || mine[0].MaximumVolumeSize == nil {
				return false, state
			}
			got = mine[0].Capacity.Value()
			return got == want && mine[0].MaximumVolumeSize.Value() == want, state
		})
		t.Logf("CSIStorageCapacity %s: %d bytes (%d MiB) for %s=%s, after %v", what, got, got>>20, v1alpha1.TopologyNodeKey, node, d.Round(time.Millisecond))
		return got
	}
	capBefore := capacityNow("before the claim")
	if capBefore <= claimed {
		t.Fatalf("CSIStorageCapacity %d bytes before the claim: no room for %d", capBefore, claimed)
	}

	// The claim, as the scheduler leaves it after picking node-a for its pod, with a
	// VolumeAttributesClass (QoS limits, vac_test.go).
	cl.createClasses(t)
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{selectedNodeAnnotation: node}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &sc.Name,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(claimed, resource.BinarySI),
			}},
			VolumeAttributesClassName: ptr(vacCreate),
		},
	}
	if err := cl.c.Create(ctx, pvc); err != nil {
		t.Fatalf("create PVC: %v", err)
	}
	key := client.ObjectKeyFromObject(pvc)
	d := waitFor(t, 2*time.Minute, "PVC Bound", func() (bool, string) {
		if err := cl.c.Get(ctx, key, pvc); err != nil {
			return false, err.Error()
		}
		return pvc.Status.Phase == corev1.ClaimBound, fmt.Sprintf("phase %s, volume %q, annotations %v; events: %s%s",
			pvc.Status.Phase, pvc.Spec.VolumeName, pvc.Annotations, cl.events(t, pvc.Namespace, pvc.Name), provisioner.exited())
	})
	t.Logf("PVC %s Bound to %s in %v", key, pvc.Spec.VolumeName, d.Round(time.Millisecond))

	var pv corev1.PersistentVolume
	if err := cl.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		t.Fatalf("PV %s: %v", pvc.Spec.VolumeName, err)
	}
	src := pv.Spec.CSI
	if src == nil || src.Driver != v1alpha1.DriverName || src.FSType != "ext4" || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		pv.Spec.Capacity.Storage().Value() < claimed || !nodeAffinityIs(&pv, node) {
		t.Fatalf("PV %s: %+v, want a %s ext4 volume of at least %d bytes, reclaim Delete, node affinity %s=%s",
			pv.Name, pv.Spec, v1alpha1.DriverName, claimed, v1alpha1.TopologyNodeKey, node)
	}
	vol, err := cl.getVolume(ctx, src.VolumeHandle)
	if err != nil {
		t.Fatalf("Raid10Volume of PV %s (volume handle %s): %v", pv.Name, src.VolumeHandle, err)
	}
	t.Logf("Raid10Volume %s: node %s, %d bytes, phase %s, health %s, members %s, annotations %v",
		vol.Name, vol.Spec.Node, vol.Spec.SizeBytes, vol.Status.Phase, vol.Status.Health, vol.Status.InSync, vol.Annotations)
	if vol.Spec.Node != node || vol.Status.Phase != v1alpha1.VolumePhaseReady || vol.Status.Health != v1alpha1.VolumeHealthHealthy ||
		vol.Status.InSync != "4/4" || vol.Spec.FSType != v1alpha1.FSTypeExt4 {
		t.Fatalf("Raid10Volume %s: spec %+v, status %+v; want Ready, Healthy, 4/4, ext4 on %s", vol.Name, vol.Spec, vol.Status, node)
	}
	for k, want := range map[string]string{
		v1alpha1.PVCNameAnnotation: pvc.Name, v1alpha1.PVCNamespaceAnnotation: pvc.Namespace, v1alpha1.PVNameAnnotation: pv.Name,
	} {
		if got := vol.Annotations[k]; got != want {
			t.Errorf("Raid10Volume %s annotation %s = %q, want %q (from --extra-create-metadata)", vol.Name, k, got, want)
		}
	}
	if _, err := pl.Volume(vol.Name); err != nil {
		t.Fatalf("the pool has no volume %s: %v", vol.Name, err)
	}

	cl.waitLimits(t, vol.Name, pl, v1alpha1.VolumeLimits{WriteIOPS: 100}, func() (bool, string) { return true, "" })
	cl.changeClass(t, key, vol.Name, pl, func() string { return provisioner.exited() + resizerProc.exited() })

	capProvisioned := capacityNow("after provisioning")
	if capProvisioned >= capBefore {
		t.Fatalf("CSIStorageCapacity %d after provisioning, %d before: the volume took no space", capProvisioned, capBefore)
	}
	t.Logf("provisioning %d MiB took %d MiB of the node's CSIStorageCapacity", claimed>>20, (capBefore-capProvisioned)>>20)

	// Expansion: csi-resizer turns the larger request into ControllerExpandVolume and the
	// agent grows the array in place. A filesystem also needs NodeExpandVolume, which only a
	// kubelet calls, so the claim is left FileSystemResizePending with the PV at the new size.
	grown := pvc.DeepCopy()
	grown.Spec.Resources.Requests[corev1.ResourceStorage] = *resource.NewQuantity(2*claimed, resource.BinarySI)
	if err := cl.c.Patch(ctx, grown, client.MergeFrom(pvc)); err != nil {
		t.Fatalf("grow the PVC to %d bytes: %v", 2*claimed, err)
	}
	d = waitFor(t, 2*time.Minute, "PV grown and PVC FileSystemResizePending", func() (bool, string) {
		var p corev1.PersistentVolume
		if err := cl.c.Get(ctx, client.ObjectKey{Name: pv.Name}, &p); err != nil {
			return false, err.Error()
		}
		if err := cl.c.Get(ctx, key, pvc); err != nil {
			return false, err.Error()
		}
		pending := false
		for _, c := range pvc.Status.Conditions {
			pending = pending || (c.Type == corev1.PersistentVolumeClaimFileSystemResizePending && c.Status == corev1.ConditionTrue)
		}
		return p.Spec.Capacity.Storage().Value() >= 2*claimed && pending,
			fmt.Sprintf("PV capacity %v; PVC conditions %+v, status capacity %v; events: %s%s%s", p.Spec.Capacity.Storage(),
				pvc.Status.Conditions, pvc.Status.Capacity.Storage(), cl.events(t, pvc.Namespace, pvc.Name), provisioner.exited(), resizerProc.exited())
	})
	t.Logf("PV %s grown to %d MiB in %v; claim FileSystemResizePending (no kubelet)", pv.Name, 2*claimed>>20, d.Round(time.Millisecond))
	vol, err = cl.getVolume(ctx, vol.Name)
	if err != nil {
		t.Fatal(err)
	}
	if vol.Spec.SizeBytes < 2*claimed || vol.Status.Phase != v1alpha1.VolumePhaseReady || vol.Status.Health != v1alpha1.VolumeHealthHealthy ||
		vol.Status.Capacity == nil || vol.Status.Capacity.Value() < 2*claimed || vol.Status.ObservedGeneration != vol.Generation {
		t.Fatalf("Raid10Volume %s after expansion: spec %+v, status %+v; want Ready, Healthy, at least %d bytes", vol.Name, vol.Spec, vol.Status, 2*claimed)
	}
	if vi, err := pl.Volume(vol.Name); err != nil || vi.Size < 2*claimed {
		t.Fatalf("pool volume %s after expansion: %+v, %v; want at least %d bytes", vol.Name, vi, err, 2*claimed)
	}
	if capGrown := capacityNow("after expansion"); capGrown >= capProvisioned {
		t.Fatalf("CSIStorageCapacity %d after expansion, %d before it: the growth took no space", capGrown, capProvisioned)
	}

	// Reclaim Delete: the PV, the Raid10Volume and the extents go; the capacity comes back.
	if err := cl.c.Delete(ctx, pvc); err != nil {
		t.Fatalf("delete PVC: %v", err)
	}
	d = waitFor(t, 2*time.Minute, "PV and Raid10Volume gone after the claim's deletion", func() (bool, string) {
		var p corev1.PersistentVolume
		pvErr := cl.c.Get(ctx, client.ObjectKey{Name: pv.Name}, &p)
		_, volErr := cl.getVolume(ctx, vol.Name)
		return apierrors.IsNotFound(pvErr) && apierrors.IsNotFound(volErr), fmt.Sprintf("PV: phase %s finalizers %v (%v); Raid10Volume: %v; events: %s%s",
			p.Status.Phase, p.Finalizers, pvErr, volErr, cl.events(t, "", pv.Name), provisioner.exited())
	})
	t.Logf("PV %s and Raid10Volume gone %v after the claim's deletion", pv.Name, d.Round(time.Millisecond))
	if _, err := pl.Volume(vol.Name); err == nil {
		t.Fatalf("the pool still has volume %s after the claim's deletion", vol.Name)
	}
	if err := pl.Check(); err != nil {
		t.Fatalf("pool check after delete: %v", err)
	}
	if c := pl.Capacity(); c.FreeRaw != c.Raw {
		t.Fatalf("pool after delete: %d of %d raw bytes free", c.FreeRaw, c.Raw)
	}
	if capBack := capacityNow("after the claim's deletion"); capBack != capBefore {
		t.Fatalf("CSIStorageCapacity %d after the claim's deletion, %d before the claim", capBack, capBefore)
	}

	// An encrypted claim: the node-stage Secret's reference on the PV, and the kubelet's part.
	encryptedClaim(t, cl, node, &sc, provisioner.exited)
}

// nodeAffinityIs reports whether the PV may only be used on node, by our topology key.
func nodeAffinityIs(pv *corev1.PersistentVolume, node string) bool {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return false
	}
	exprs := na.Required.NodeSelectorTerms[0].MatchExpressions
	return len(exprs) == 1 && exprs[0].Key == v1alpha1.TopologyNodeKey && exprs[0].Operator == corev1.NodeSelectorOpIn &&
		len(exprs[0].Values) == 1 && exprs[0].Values[0] == node
}

// events describes the core Events about the object name (in namespace ns, or in any),
// for the state that a failed wait prints.
func (cl *cluster) events(t *testing.T, ns, name string) string {
	var l corev1.EventList
	if err := cl.c.List(t.Context(), &l, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range l.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
		}
	}
	return "[" + strings.Join(out, "; ") + "]"
}
