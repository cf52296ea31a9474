package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// kubeconform validates manifests against JSON schemas, which it normally downloads from
// GitHub (yannh/kubernetes-json-schema). The test machines have no internet, so
// kubeconformSchemas makes them offline from the real kube-apiserver's /openapi/v2 with the
// chart's CRDs installed: the built-in kinds and Raid10Volume/Raid10Node (whose
// openAPIV3Schema the API server publishes there) in kubeconform's "standalone-strict"
// layout, as openapi2jsonschema --stand-alone --strict would write them.

// kubeconformBinary returns the pinned kubeconform of hack/csi-tools.sh, building it when
// missing (about 30 s). Missing fails the test under CI (internal/testenv) and skips it otherwise.
func kubeconformBinary(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", `source hack/csi-tools.sh && csi_tool kubeconform`)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		testenv.Missing(t, "kubeconform (hack/csi-tools.sh): %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// schemaFileName is the file kubeconform looks for with the location template
// "{{ .ResourceKind }}{{ .KindSuffix }}.json": the kind in lower case, then "-" and the
// group's first label (none for the core group), then "-" and the version.
func schemaFileName(group, version, kind string) string {
	name := strings.ToLower(kind)
	if group != "" {
		name += "-" + strings.ToLower(strings.Split(group, ".")[0])
	}
	return name + "-" + strings.ToLower(version) + ".json"
}

// strictify denies properties a schema does not list (additionalProperties: false on every
// object schema with properties and no additionalProperties of its own), as kubectl's
// client-side validation and openapi2jsonschema --strict do.
func strictify(v any) {
	switch x := v.(type) {
	case map[string]any:
		if _, ok := x["properties"]; ok {
			if _, ok := x["additionalProperties"]; !ok {
				x["additionalProperties"] = false
			}
		}
		for _, c := range x {
			strictify(c)
		}
	case []any:
		for _, c := range x {
			strictify(c)
		}
	}
}

// refsOf collects the "#/definitions/NAME" references in v.
func refsOf(v any, into map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		if r, ok := x["$ref"].(string); ok {
			into[strings.TrimPrefix(r, "#/definitions/")] = true
		}
		for _, c := range x {
			refsOf(c, into)
		}
	case []any:
		for _, c := range x {
			refsOf(c, into)
		}
	}
}

// writeSchemas converts an OpenAPI v2 document into one standalone, strict JSON schema per
// group/version/kind in dir: {"$ref": "#/definitions/<the kind>", "definitions": <every
// definition it reaches>}. It returns how many it wrote.
func writeSchemas(t *testing.T, openapi []byte, dir string) int {
	t.Helper()
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(openapi, &doc); err != nil {
		t.Fatalf("/openapi/v2: %v", err)
	}
	defs := doc.Definitions
	// The two string formats that YAML also writes as numbers.
	defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
	defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
	for _, d := range defs {
		strictify(d)
	}
	n := 0
	names := make([]string, 0, len(defs))
	for name := range defs {
		names = append(names, name)
	}
	slices.Sort(names) // a GVK named by two definitions: the first by name wins, every run
	written := map[string]bool{}
	for _, name := range names {
		gvks, _ := defs[name]["x-kubernetes-group-version-kind"].([]any)
		if len(gvks) != 1 { // none: not a kind; several: DeleteOptions and the like
			continue
		}
		gvk := gvks[0].(map[string]any)
		file := schemaFileName(gvk["group"].(string), gvk["version"].(string), gvk["kind"].(string))
		if written[file] {
			continue
		}
		// Every definition reachable from this one.
		reach := map[string]bool{name: true}
		for todo := []string{name}; len(todo) > 0; {
			cur := todo[len(todo)-1]
			todo = todo[:len(todo)-1]
			next := map[string]bool{}
			refsOf(defs[cur], next)
			for r := range next {
				if !reach[r] {
					if _, ok := defs[r]; !ok {
						t.Fatalf("/openapi/v2: %s refers to %s, which it does not define", cur, r)
					}
					reach[r] = true
					todo = append(todo, r)
				}
			}
		}
		sub := map[string]any{}
		for r := range reach {
			sub[r] = defs[r]
		}
		b, err := json.Marshal(map[string]any{
			"$schema":     "http://json-schema.org/draft-07/schema#",
			"$ref":        "#/definitions/" + name,
			"definitions": sub,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o600); err != nil {
			t.Fatal(err)
		}
		written[file] = true
		n++
	}
	return n
}

// kubeconformResult is kubeconform's -output json.
type kubeconformResult struct {
	Resources []struct {
		Filename string `json:"filename"`
		Kind     string `json:"kind"`
		Name     string `json:"name"`
		Status   string `json:"status"`
		Msg      string `json:"msg"`
	} `json:"resources"`
	Summary struct {
		Valid   int `json:"valid"`
		Invalid int `json:"invalid"`
		Errors  int `json:"errors"`
		Skipped int `json:"skipped"`
	} `json:"summary"`
}

func runKubeconform(t *testing.T, bin, schemaDir string, files ...string) kubeconformResult {
	t.Helper()
	args := append([]string{"-strict", "-summary", "-output", "json", "-verbose",
		"-schema-location", filepath.Join(schemaDir, "{{ .ResourceKind }}{{ .KindSuffix }}.json")}, files...)
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run() // exit status 1 when something is invalid: the JSON says what
	var res kubeconformResult
	if jerr := json.Unmarshal(stdout.Bytes(), &res); jerr != nil {
		t.Fatalf("kubeconform %v: %v, output %v\n%s%s", files, err, jerr, stdout.String(), stderr.String())
	}
	return res
}

// TestKubeconform validates the chart's renderings (defaults with the CRDs, a custom
// StorageClass, a block of disks) with kubeconform -strict against schemas made from the
// real kube-apiserver, and checks that the same schemas refuse broken manifests: an unknown
// field, a wrong type, a Raid10Volume that breaks its CRD's schema.
func TestKubeconform(t *testing.T) {
	kc := kubeconformBinary(t)
	helmBin := helmBinary(t)
	env := kubeenv.Start(t, kubeenv.WithAPIServerFlags("--endpoint-reconciler-type=none"))
	env.InstallCRDs(t, filepath.Join(chartDir, "crds"))
	env.InstallCRDs(t, filepath.Join(chartDir, "charts", "snapshot-crds", "crds"))

	// The CRDs' schemas reach /openapi/v2 shortly after they are Established.
	var openapi []byte
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := env.Client.Discovery().RESTClient().Get().AbsPath("/openapi/v2").SetHeader("Accept", "application/json").DoRaw(t.Context())
		if err == nil && bytes.Contains(b, []byte(`"io.csi.raid10.v1alpha1.Raid10Volume"`)) && bytes.Contains(b, []byte(`"io.csi.raid10.v1alpha1.Raid10Node"`)) {
			openapi = b
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/openapi/v2 without the Raid10 kinds after a minute (last error %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	schemas := t.TempDir()
	n := writeSchemas(t, openapi, schemas)
	for _, f := range []string{"deployment-apps-v1.json", "daemonset-apps-v1.json", "configmap-v1.json", "storageclass-storage-v1.json",
		"csidriver-storage-v1.json", "clusterrole-rbac-v1.json", "customresourcedefinition-apiextensions-v1.json",
		"raid10volume-raid10-v1alpha1.json", "raid10node-raid10-v1alpha1.json"} {
		if _, err := os.Stat(filepath.Join(schemas, f)); err != nil {
			t.Fatalf("no schema %s among the %d made from /openapi/v2", f, n)
		}
	}
	t.Logf("%d schemas from the API server's /openapi/v2 (%d bytes)", n, len(openapi))

	dir := t.TempDir()
	render := func(name string, args ...string) string {
		args = append([]string{"template", "raid10-csi", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, args...)
		out, stderr, err := helm(t, helmBin, args...)
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, stderr)
		}
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("Chart", func(t *testing.T) {
		files := []string{
			render("defaults", "--include-crds"),
			render("storageclass", "--set", "storageClass.name=fast", "--set", "storageClass.fsType=xfs", "--set", "storageClass.reclaimPolicy=Retain",
				"--set-string", "storageClass.parameters.members=2", "--set", "storageClass.isDefault=true"),
			render("disks", "--set", "node.pool.disks[0].path=/dev/disk/by-id/nvme-A", "--set", "node.pool.disks[1].path=/dev/disk/by-id/nvme-B",
				"--set", "node.pool.disks[1].wipe=true", "--set", "node.pool.rebuildRateMax=104857600",
				"--set", "controller.resources.limits.memory=256Mi", "--set", "node.resources.limits.cpu=2"),
			"../../deploy/raid10-csi.yaml",
		}
		res := runKubeconform(t, kc, schemas, files...)
		for _, r := range res.Resources {
			// No status and no kind: a YAML document with no object (helm writes one per
			// template that renders nothing but comments); kubeconform counts it nowhere.
			if r.Status != "statusValid" && (r.Status != "" || r.Kind != "") {
				t.Errorf("%s: %s %s: %s %s", filepath.Base(r.Filename), r.Kind, r.Name, r.Status, r.Msg)
			}
		}
		t.Logf("kubeconform -strict: %+v", res.Summary)
		if res.Summary.Valid < 4*10 || res.Summary.Invalid+res.Summary.Errors+res.Summary.Skipped != 0 {
			t.Fatalf("kubeconform summary %+v: want every object valid, none skipped", res.Summary)
		}
	})

	t.Run("RefusesBrokenManifests", func(t *testing.T) {
		cases := map[string]string{ // name: manifest; each must be invalid
			"UnknownField": `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: x, namespace: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      hostNetwrok: true
      containers: [{name: c, image: i}]
`,
			"WrongType": `apiVersion: apps/v1
kind: Deployment
metadata: {name: x, namespace: x}
spec:
  replicas: two
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec: {containers: [{name: c, image: i}]}
`,
			"CRDSchema": `apiVersion: raid10.csi.io/v1alpha1
kind: Raid10Volume
metadata: {name: x}
spec:
  node: n1
  sizeBytes: 1073741824
  volumeMode: Sideways
  layout: {members: 4, chunkSizeBytes: 524288}
`,
			"CRDUnknownField": `apiVersion: raid10.csi.io/v1alpha1
kind: Raid10Node
metadata: {name: n1}
spec:
  diskReplacement: {oldDisk: d1, newPath: /dev/sdb, format: true}
`,
		}
		valid := `apiVersion: raid10.csi.io/v1alpha1
kind: Raid10Volume
metadata: {name: ok}
spec:
  node: n1
  sizeBytes: 1073741824
  volumeMode: Filesystem
  fsType: xfs
  layout: {members: 4, chunkSizeBytes: 524288}
`
		var files []string
		names := map[string]string{}
		for name, m := range cases {
			p := filepath.Join(dir, "bad-"+name+".yaml")
			if err := os.WriteFile(p, []byte(m), 0o600); err != nil {
				t.Fatal(err)
			}
			files = append(files, p)
			names[p] = name
		}
		okFile := filepath.Join(dir, "good-raid10volume.yaml")
		if err := os.WriteFile(okFile, []byte(valid), 0o600); err != nil {
			t.Fatal(err)
		}
		res := runKubeconform(t, kc, schemas, append(files, okFile)...)
		seen := map[string]bool{}
		for _, r := range res.Resources {
			switch {
			case r.Filename == okFile && r.Status != "statusValid":
				t.Errorf("a valid Raid10Volume: %s %s", r.Status, r.Msg)
			case r.Filename != okFile && r.Status != "statusInvalid":
				t.Errorf("%s: %s, want invalid (%s)", names[r.Filename], r.Status, r.Msg)
			case r.Filename != okFile:
				seen[names[r.Filename]] = true
				t.Logf("%s refused: %s", names[r.Filename], r.Msg)
			}
		}
		if len(seen) != len(cases) {
			t.Fatalf("refused %v of %d broken manifests; summary %+v", seen, len(cases), res.Summary)
		}
	})
}
