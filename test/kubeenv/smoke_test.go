package kubeenv_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

var widgetGVR = schema.GroupVersionResource{Group: "raid10.csi.io", Version: "v1alpha1", Resource: "widgets"}

// widgetCRD is a minimal namespaced CRD of the project's API group.
func widgetCRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: widgetGVR.Resource + "." + widgetGVR.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: widgetGVR.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList",
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: widgetGVR.Version, Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{
					OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object",
						Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"spec": {
								Type:       "object",
								Required:   []string{"size"},
								Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}},
							},
						},
					},
				},
			}},
		},
	}
}

// TestSmoke: a CRD becomes established and serves objects, and RBAC refuses a
// ServiceAccount until a RoleBinding grants it access.
func TestSmoke(t *testing.T) {
	env := kubeenv.Start(t)
	ctx := t.Context()
	begin := time.Now()

	// The CRD.
	ext, err := apiextensionsclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	phase := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not established: %v", crd.Name, err)
	}
	t.Logf("CRD %s established in %v", crd.Name, time.Since(phase).Round(time.Millisecond))

	// An object of it, written and read back through the dynamic client.
	const ns = "smoke"
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	widget := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": widgetGVR.GroupVersion().String(),
		"kind":       "Widget",
		"metadata":   map[string]any{"name": "w1"},
		"spec":       map[string]any{"size": int64(42)},
	}}
	if _, err := dyn.Resource(widgetGVR).Namespace(ns).Create(ctx, widget, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Widget: %v", err)
	}
	got, err := dyn.Resource(widgetGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Widget: %v", err)
	}
	if size, found, err := unstructured.NestedInt64(got.Object, "spec", "size"); err != nil || !found || size != 42 {
		t.Fatalf("Widget read back: spec.size = %d (found %v, err %v), want 42", size, found, err)
	}
	// The schema is enforced: spec.size is required.
	bad := widget.DeepCopy()
	bad.SetName("w2")
	unstructured.RemoveNestedField(bad.Object, "spec", "size")
	if _, err := dyn.Resource(widgetGVR).Namespace(ns).Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("create Widget without spec.size: err = %v, want Invalid", err)
	}

	// RBAC: a ServiceAccount without a binding is authenticated but refused.
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	saConfig := env.ServiceAccountConfig(t, ns, "nobody")
	saClient, err := kubernetes.NewForConfig(saConfig)
	if err != nil {
		t.Fatal(err)
	}
	review, err := saClient.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview as the ServiceAccount: %v", err)
	}
	if want := "system:serviceaccount:" + ns + ":nobody"; review.Status.UserInfo.Username != want {
		t.Fatalf("ServiceAccount token authenticates as %q, want %q", review.Status.UserInfo.Username, want)
	}
	saDyn, err := dynamic.NewForConfig(saConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := saDyn.Resource(widgetGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("get Widget as a ServiceAccount without a RoleBinding: err = %v, want Forbidden", err)
	}
	if _, err := saClient.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list Secrets as a ServiceAccount without a RoleBinding: err = %v, want Forbidden", err)
	}

	// The same ServiceAccount is allowed once a RoleBinding grants it (the RBAC authorizer
	// sees the binding through an informer, so allow it a moment).
	if _, err := env.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "widget-reader"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{widgetGVR.Group}, Resources: []string{widgetGVR.Resource}, Verbs: []string{"get"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nobody-reads-widgets"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "widget-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "nobody"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := saDyn.Resource(widgetGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
		if apierrors.IsForbidden(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("get Widget after the RoleBinding: %v", err)
	}
	// The binding grants get on widgets only.
	if _, err := saClient.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list Secrets with a widgets-only RoleBinding: err = %v, want Forbidden", err)
	}
	t.Logf("smoke checks took %v after a startup of %v", time.Since(begin).Round(time.Millisecond), env.StartupTime.Round(time.Millisecond))
}

// TestControllerManager: with kube-controller-manager running, the PV binder binds a claim
// to a matching volume (no node, no provisioner: static binding, Immediate mode).
func TestControllerManager(t *testing.T) {
	env := kubeenv.Start(t, kubeenv.WithControllerManager())
	ctx := t.Context()
	begin := time.Now()

	const class = "kubeenv-static"
	size := resource.MustParse("1Gi")
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-kubeenv"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: "raid10.csi.io", VolumeHandle: "vol-kubeenv"},
			},
		},
	}
	if _, err := env.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: new(class),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if _, err := env.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := pvc
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := env.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = c
		return got.Status.Phase == corev1.ClaimBound, nil
	})
	if err != nil {
		t.Fatalf("claim not bound by kube-controller-manager: %v (last status %+v)", err, got.Status)
	}
	if got.Spec.VolumeName != pv.Name {
		t.Fatalf("claim bound to %q, want %q", got.Spec.VolumeName, pv.Name)
	}
	t.Logf("claim bound to %s in %v after a startup of %v", got.Spec.VolumeName, time.Since(begin).Round(time.Millisecond), env.StartupTime.Round(time.Millisecond))
}

// TestSchedulerConfig: kube-scheduler runs from the configuration WithSchedulerConfig
// writes (its /configz shows the fields set), and Get reads its /metrics and, with
// Profiling, a CPU profile.
func TestSchedulerConfig(t *testing.T) {
	env := kubeenv.Start(t, kubeenv.WithSchedulerConfig(kubeenv.SchedulerConfig{
		PercentageOfNodesToScore: 7, QPS: 123, Burst: 246, Profiling: true,
	}))
	ctx := t.Context()
	configz, err := env.Get(ctx, env.SchedulerURL+"/configz")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Config struct {
			PercentageOfNodesToScore *int32 `json:"percentageOfNodesToScore"`
			EnableProfiling          bool   `json:"enableProfiling"`
			ClientConnection         struct {
				QPS   float32 `json:"qps"`
				Burst int32   `json:"burst"`
			} `json:"clientConnection"`
		} `json:"componentconfig"`
	}
	if err := json.Unmarshal(configz, &got); err != nil {
		t.Fatalf("/configz: %v: %.300s", err, configz)
	}
	c := got.Config
	if c.PercentageOfNodesToScore == nil || *c.PercentageOfNodesToScore != 7 || !c.EnableProfiling ||
		c.ClientConnection.QPS != 123 || c.ClientConnection.Burst != 246 {
		t.Fatalf("kube-scheduler's configuration is not the one given: %.600s", configz)
	}
	metrics, err := env.Get(ctx, env.SchedulerURL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(metrics), "scheduler_pending_pods") {
		t.Errorf("/metrics has no scheduler_pending_pods: %.300s", metrics)
	}
	profile, err := env.Get(ctx, env.SchedulerURL+"/debug/pprof/profile?seconds=1")
	if err != nil {
		t.Fatal(err)
	}
	// A CPU profile is gzipped protobuf.
	if len(profile) < 2 || profile[0] != 0x1f || profile[1] != 0x8b {
		t.Errorf("the CPU profile is not gzip: %.100q", profile)
	}
}
