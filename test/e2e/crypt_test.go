package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
)

// The keys of encryptedClaim's Secret: the volume's header is keyed with oldKey before the
// stage, the Secret rotates it to newKey.
const (
	encOldKey = "e2e-old-passphrase"
	encNewKey = "e2e-new-passphrase"
)

// The CSI secrets convention's StorageClass parameters for the node-stage Secret.
const (
	nodeStageSecretName      = "csi.storage.k8s.io/node-stage-secret-name"
	nodeStageSecretNamespace = "csi.storage.k8s.io/node-stage-secret-namespace"
)

// encryptedClaim is the key flow of an encrypted claim on the real API server, run by
// pvcFlow with its csi-provisioner (exited says whether it died). A StorageClass like the
// chart's with encrypted: "true" names the node-stage Secret through the provisioner's
// templates (${pvc.name}-key in ${pvc.namespace}); the Secret carries the key and a previous
// key (a rotation). The claim, provisioned by the real csi-provisioner, gets a PV whose
// spec.csi.nodeStageSecretRef names the Secret (the templates resolved), whose volume
// attributes say encrypted, and no other secret reference: CreateVolume needs no key. The
// Raid10Volume is annotated and its status says encrypted.
//
// There is no kubelet: the test does the kubelet's part, reading the Secret that the PV
// names (as the kubelet's CSI plugin does, with the node's credentials; here the admin's)
// into NodeStageVolume's secrets, and stages the volume through the real node service and
// real cryptsetup on a file that stands for the served device, keyed with the previous key:
// the stage rotates the header to the Secret's key (the volume key and the data stay), and
// then stops at the mapping where the host has no device-mapper. That the chart's
// ServiceAccounts never touch Secrets is TestRBACLeastPrivilege's audit check
// (secretsUntouched).
func encryptedClaim(t *testing.T, cl *cluster, node string, base *storagev1.StorageClass, exited func() string) {
	ctx := t.Context()
	const claim, className = "data-enc", "raid10-encrypted"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: claim + "-key", Namespace: metav1.NamespaceDefault},
		Data: map[string][]byte{driver.SecretKeyField: []byte(encNewKey), driver.SecretPreviousKeyField: []byte(encOldKey)}}
	params := maps.Clone(base.Parameters)
	params[driver.ParamEncrypted] = "true"
	params[nodeStageSecretName] = "${pvc.name}-key"
	params[nodeStageSecretNamespace] = "${pvc.namespace}"
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: className}, Provisioner: v1alpha1.DriverName, Parameters: params,
		VolumeBindingMode: base.VolumeBindingMode, ReclaimPolicy: base.ReclaimPolicy, AllowVolumeExpansion: base.AllowVolumeExpansion}
	for _, o := range []client.Object{secret, sc} {
		if err := cl.c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
		t.Cleanup(func() { _ = cl.c.Delete(context.Background(), o) })
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: metav1.NamespaceDefault, Annotations: map[string]string{selectedNodeAnnotation: node}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr(className),
			VolumeMode: ptr(corev1.PersistentVolumeBlock),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(32<<20, resource.BinarySI)}},
		},
	}
	if err := cl.c.Create(ctx, pvc); err != nil {
		t.Fatalf("create PVC %s: %v", claim, err)
	}
	key := client.ObjectKeyFromObject(pvc)
	d := waitFor(t, 2*time.Minute, "encrypted PVC Bound", func() (bool, string) {
		if err := cl.c.Get(ctx, key, pvc); err != nil {
			return false, err.Error()
		}
		return pvc.Status.Phase == corev1.ClaimBound, fmt.Sprintf("phase %s; events: %s%s", pvc.Status.Phase, cl.events(t, pvc.Namespace, pvc.Name), exited())
	})
	var pv corev1.PersistentVolume
	if err := cl.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	src := pv.Spec.CSI
	if src == nil {
		t.Fatalf("PV %s is no CSI volume: %+v", pv.Name, pv.Spec)
	}
	t.Logf("encrypted PVC %s Bound to %s in %v: nodeStageSecretRef %+v, volume attributes %v", key, pv.Name, d.Round(time.Millisecond),
		src.NodeStageSecretRef, src.VolumeAttributes)
	if ref := src.NodeStageSecretRef; ref == nil || ref.Name != secret.Name || ref.Namespace != secret.Namespace {
		t.Fatalf("PV %s: nodeStageSecretRef %+v; want %s/%s (the StorageClass's templates resolved)", pv.Name, ref, secret.Namespace, secret.Name)
	}
	if src.ControllerPublishSecretRef != nil || src.NodePublishSecretRef != nil || src.ControllerExpandSecretRef != nil || src.NodeExpandSecretRef != nil {
		t.Errorf("PV %s names secrets beyond the node-stage one: %+v", pv.Name, src)
	}
	if src.VolumeAttributes[driver.ParamEncrypted] != "true" {
		t.Fatalf("PV %s: volume attributes %v; want %s=true for NodeStageVolume", pv.Name, src.VolumeAttributes, driver.ParamEncrypted)
	}
	waitFor(t, time.Minute, "Raid10Volume encrypted", func() (bool, string) {
		vol, err := cl.getVolume(ctx, src.VolumeHandle)
		if err != nil {
			return false, err.Error()
		}
		return vol.Annotations[v1alpha1.EncryptedAnnotation] == "true" && vol.Status.Encrypted,
			fmt.Sprintf("annotations %v, status.encrypted %v", vol.Annotations, vol.Status.Encrypted)
	})

	stageAsKubelet(t, cl, node, &pv)

	if err := cl.c.Delete(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "encrypted PV and Raid10Volume gone", func() (bool, string) {
		pvErr := cl.c.Get(ctx, client.ObjectKey{Name: pv.Name}, &corev1.PersistentVolume{})
		_, volErr := cl.getVolume(ctx, src.VolumeHandle)
		return apierrors.IsNotFound(pvErr) && apierrors.IsNotFound(volErr), fmt.Sprintf("PV: %v; Raid10Volume: %v%s", pvErr, volErr, exited())
	})
}

// stageAsKubelet reads the Secret that pv's nodeStageSecretRef names into NodeStageVolume's
// secrets as the kubelet's CSI plugin does (each data field as a string) and stages the
// Block volume through the real node service over a file keyed with encOldKey: the stage
// rotates it to the Secret's key. It ends at the mapping on a host without device-mapper
// (an error that is not the key's, nothing mapped); where the mapping opens, it unstages.
func stageAsKubelet(t *testing.T, cl *cluster, node string, pv *corev1.PersistentVolume) {
	testenv.RequireTools(t, "cryptsetup", "blkid")
	ctx := t.Context()
	ref := pv.Spec.CSI.NodeStageSecretRef
	var s corev1.Secret
	if err := cl.c.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &s); err != nil {
		t.Fatalf("the PV's node-stage Secret %s/%s: %v", ref.Namespace, ref.Name, err)
	}
	secrets := map[string]string{}
	for k, v := range s.Data {
		secrets[k] = string(v)
	}

	dev := filepath.Join(t.TempDir(), "served.img")
	if err := os.WriteFile(dev, nil, 0o600); err != nil || os.Truncate(dev, 20<<20) != nil {
		t.Fatalf("served device file: %v", err)
	}
	ex := utilexec.New()
	kdf := crypt.Options{PBKDF: crypt.PBKDFPBKDF2, ForceIterations: 1000}
	probe := mount.NewSafeFormatAndMount(mount.NewFakeMounter(nil), ex).GetDiskFormat
	if err := crypt.New(ex, probe, kdf).Format(ctx, dev, []byte(encOldKey)); err != nil {
		t.Fatal(err)
	}
	ns, err := driver.NewNodeServer(driver.NodeConfig{NodeID: node, Attacher: fileAttacher{dev}, Mounter: mount.NewFakeMounter(nil),
		Exec: ex, Crypt: kdf})
	if err != nil {
		t.Fatal(err)
	}
	id, staging := pv.Spec.CSI.VolumeHandle, t.TempDir()
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	_, err = ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: block,
		VolumeContext: pv.Spec.CSI.VolumeAttributes, Secrets: secrets})
	if err == nil { // a host with device-mapper: the mapping is open, close it
		defer func() {
			if _, err := ns.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
				t.Errorf("NodeUnstageVolume %s: %v", id, err)
			}
		}()
	}
	if errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrFailedPrecondition) {
		t.Fatalf("NodeStageVolume with the Secret of the PV: %v", err)
	}
	t.Logf("NodeStageVolume %s with the Secret's fields %v: %v (nil where the host has device-mapper)", id, slices.Sorted(maps.Keys(secrets)), err)
	if !passphraseOpens(t, dev, encNewKey) || passphraseOpens(t, dev, encOldKey) {
		t.Fatalf("after NodeStageVolume the header should open with the Secret's %s and no longer with its %s",
			driver.SecretKeyField, driver.SecretPreviousKeyField)
	}
}

// fileAttacher serves every volume on one file, the stand-in of a served device.
type fileAttacher struct{ path string }

var _ driver.VolumeAttacher = fileAttacher{}

func (a fileAttacher) Attach(context.Context, string) (string, error) { return a.path, nil }
func (a fileAttacher) Detach(context.Context, string) error           { return nil }
func (a fileAttacher) Device(string) string                           { return a.path }
func (a fileAttacher) Volume(context.Context, string) (attach.VolumeState, error) {
	return attach.VolumeState{SizeBytes: 20 << 20}, nil
}
func (a fileAttacher) Expand(context.Context, string) (int64, error) {
	return 0, errors.New("fileAttacher: no expansion")
}

// passphraseOpens reports whether key opens a keyslot of the LUKS2 header on dev
// (cryptsetup open --test-passphrase: no mapping).
func passphraseOpens(t *testing.T, dev, key string) bool {
	t.Helper()
	cmd := exec.Command("cryptsetup", "open", "--test-passphrase", "--type", "luks2", "--key-file=-", dev)
	cmd.Stdin = strings.NewReader(key)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ee) && ee.ExitCode() == 2: // no keyslot opens
		return false
	}
	t.Fatalf("cryptsetup open --test-passphrase %s: %v: %s", dev, err, out)
	return false
}

// secretsUntouched fails t for every request of a chart ServiceAccount (in used, the audit
// log's requests per user) on Secrets: the node-stage Secret of an encrypted volume is the
// kubelet's to read, and CreateVolume needs no provisioner secret, so the chart grants no
// access to Secrets and none is asked for.
func secretsUntouched(t *testing.T, used map[string]map[access]*usage) {
	t.Helper()
	for _, sa := range []string{controllerSA, nodeSA} {
		for a, u := range used["system:serviceaccount:"+namespace+":"+sa] {
			if a.group == "" && a.resource == "secrets" {
				t.Errorf("ServiceAccount %s: %d requests %s (clients %v): no chart component may read Secrets",
					sa, u.requests, a, slices.Sorted(maps.Keys(u.clients)))
			}
		}
	}
}
