package e2e_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// VolumeAttributesClasses of pvcFlow: the claim is created with the first (csi-provisioner
// passes its parameters as CreateVolume's mutable_parameters) and moved to the second
// (csi-resizer's modify controller calls ControllerModifyVolume), which names another key:
// the first's stays.
const (
	vacCreate = "raid10-e2e-create"
	vacModify = "raid10-e2e-modify"
)

// createClasses creates pvcFlow's VolumeAttributesClasses; they go when t ends.
func (cl *cluster) createClasses(t *testing.T) {
	t.Helper()
	for name, params := range map[string]map[string]string{
		vacCreate: {"maxWriteIOPS": "100"},
		vacModify: {"maxReadBytesPerSecond": "8Mi"},
	} {
		vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name}, DriverName: v1alpha1.DriverName, Parameters: params}
		if err := cl.c.Create(t.Context(), vac); err != nil {
			t.Fatalf("create VolumeAttributesClass %s: %v", name, err)
		}
		t.Cleanup(func() { _ = cl.c.Delete(t.Context(), vac) })
	}
}

// changeClass moves the claim key to the class vacModify and waits until the resizer has
// modified its volume: the claim's current class is the new one, the Raid10Volume's
// spec.limits merge both classes and the node agent has put them on the array.
func (cl *cluster) changeClass(t *testing.T, key client.ObjectKey, volName string, pl *pool.Pool, exited func() string) {
	t.Helper()
	ctx := t.Context()
	var pvc corev1.PersistentVolumeClaim
	if err := cl.c.Get(ctx, key, &pvc); err != nil {
		t.Fatal(err)
	}
	moved := pvc.DeepCopy()
	moved.Spec.VolumeAttributesClassName = ptr(vacModify)
	if err := cl.c.Patch(ctx, moved, client.MergeFrom(&pvc)); err != nil {
		t.Fatalf("move the claim to VolumeAttributesClass %s: %v", vacModify, err)
	}
	d := cl.waitLimits(t, volName, pl, v1alpha1.VolumeLimits{WriteIOPS: 100, ReadBytesPerSecond: 8 << 20}, func() (bool, string) {
		if err := cl.c.Get(ctx, key, &pvc); err != nil {
			return false, err.Error()
		}
		cur := pvc.Status.CurrentVolumeAttributesClassName
		return cur != nil && *cur == vacModify, fmt.Sprintf("claim's current class %v, modify status %+v; events: %s%s",
			deref(cur), pvc.Status.ModifyVolumeStatus, cl.events(t, pvc.Namespace, pvc.Name), exited())
	})
	t.Logf("claim moved to VolumeAttributesClass %s: volume modified and limits in force in %v", vacModify, d.Round(time.Millisecond))
}

// waitLimits waits until also holds and the Raid10Volume volName has want as spec.limits and
// status.limits, and the pool's array has its rates in force.
func (cl *cluster) waitLimits(t *testing.T, volName string, pl *pool.Pool, want v1alpha1.VolumeLimits, also func() (bool, string)) time.Duration {
	t.Helper()
	return waitFor(t, 2*time.Minute, fmt.Sprintf("limits %+v on volume %s", want, volName), func() (bool, string) {
		ok, state := also()
		vol, err := cl.getVolume(t.Context(), volName)
		if err != nil {
			return false, err.Error()
		}
		a, err := pl.Array(volName)
		if err != nil {
			return false, err.Error()
		}
		l := a.Status().Limits
		inForce := v1alpha1.VolumeLimits{ReadIOPS: l.ReadIOPS, WriteIOPS: l.WriteIOPS, ReadBytesPerSecond: l.ReadBytesPerSecond, WriteBytesPerSecond: l.WriteBytesPerSecond}
		ok = ok && vol.Spec.Limits != nil && *vol.Spec.Limits == want && vol.Status.Limits != nil && *vol.Status.Limits == want && inForce == want
		return ok, fmt.Sprintf("%s; spec.limits %+v, status.limits %+v, array %+v", state, vol.Spec.Limits, vol.Status.Limits, l)
	})
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
