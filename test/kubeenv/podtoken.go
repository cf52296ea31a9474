package kubeenv

import (
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// NodeServiceAccountConfig returns a client configuration that authenticates as the
// ServiceAccount namespace/name the way a pod of a DaemonSet on node does: its token is bound
// to a Pod whose spec.nodeName is node, so the API server adds the node's name to the token
// (ServiceAccountTokenPodNodeInfo) and reports it as the user's extra
// authentication.kubernetes.io/node-name. The Pod (<name>-<node>, never started: no kubelet
// runs) is created once and kept, since the token is valid only while it exists. The Node
// itself need not exist: the token then carries its name without a uid.
func (e *Env) NodeServiceAccountConfig(t testing.TB, namespace, name, node string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + node, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: name,
			Containers:         []corev1.Container{{Name: "plugin", Image: "raid10-csi/raid10-csi"}},
		},
	}
	created, err := e.Client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = e.Client.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatalf("kubeenv: pod of ServiceAccount %s/%s on node %s: %v", namespace, name, node, err)
	}
	ttl := int64(serviceAccountTokenTTL / time.Second)
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &ttl,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: created.Name, UID: created.UID},
		}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeenv: token for ServiceAccount %s/%s bound to pod %s: %v", namespace, name, created.Name, err)
	}
	return e.tokenConfig(tr.Status.Token)
}
