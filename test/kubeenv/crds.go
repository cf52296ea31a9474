package kubeenv

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// InstallCRDs creates every CustomResourceDefinition in dir/*.yaml (the chart's crds/
// folder, say) and waits until each is Established. It returns the CRDs' names, in the
// order of the files; an empty dir fails the test.
func (e *Env) InstallCRDs(t testing.TB, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("kubeenv: CRDs in %s: %v, %v", dir, files, err)
	}
	cs, err := apiextensionsclient.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds := cs.ApiextensionsV1().CustomResourceDefinitions()
	ctx := t.Context()
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatalf("kubeenv: %s: %v", f, err)
		}
		if _, err := crds.Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("kubeenv: create CRD %s: %v", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	for _, name := range names {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			got, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err == nil && slices.ContainsFunc(got.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("kubeenv: CRD %s not Established within a minute (last error %v)", name, err)
			}
		}
	}
	return names
}
