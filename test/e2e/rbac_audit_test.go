package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// unexercised lists, per chart ServiceAccount, the grants of deploy/raid10-csi.yaml that
// are needed but that no flow of TestRBACLeastPrivilege uses, each with the reason. A
// grant that is neither used nor listed here fails the test: remove it from the chart
// (charts/raid10-csi/templates/*-rbac.yaml). An entry that the flows do use, or that the
// chart no longer grants, fails it too, so that the list stays exact.
var unexercised = map[string][]unexercisedGrant{
	controllerSA: {{
		role: "ClusterRole raid10-csi-snapshotter", group: "", resource: "events", verb: "patch",
		reason: "csi-snapshotter patches an Event that repeats (a CreateSnapshot or DeleteSnapshot failing again and again); " +
			"the snapshot flow's one refused delete (a restore still copying) ends before an Event repeats",
	}},
	// nodeSA: none; the flows use every grant.
}

// unexercisedGrant is one entry of unexercised: a grant of role ("ClusterRole name" or
// "Role name").
type unexercisedGrant struct {
	role                  string
	group, resource, verb string
	reason                string
}

// roleClients names the one client (user agent program) that each sidecar's ClusterRole is
// for: such a grant counts as used only when that client used it, so that each role stays
// exact although the ServiceAccount holds their union. The other roles count any client of
// the ServiceAccount (the plugin's client is the test binary here, raid10-csi in a pod).
var roleClients = map[string]string{
	"ClusterRole raid10-csi-provisioner": "csi-provisioner",
	"ClusterRole raid10-csi-resizer":     "csi-resizer",
	"ClusterRole raid10-csi-snapshotter": "csi-snapshotter",
}

// TestRBACLeastPrivilege proves the chart's RBAC against the real API server's audit log:
// it runs the PVC flow (create, bind, expand, delete through the real csi-provisioner and
// csi-resizer), the controller+agent flow (create, degrade, rebuild, expand, delete), a
// GetCapacity without topology, the sidecars' rare paths (rarePaths) and the snapshot flow
// (snapshot, restore, clone through the real csi-snapshotter and snapshot-controller) on one
// control plane that logs every request of the release namespace's ServiceAccounts, and
// then checks, for each chart ServiceAccount, that
//
//   - no request was denied (403), and
//   - every (API group, resource, verb) that its Roles and ClusterRoles grant through its
//     bindings in deploy/raid10-csi.yaml was used at least once (in the Role's namespace
//     for a Role), or is listed in unexercised with the reason.
//
// The table of what each ServiceAccount used and what it was granted is logged.
func TestRBACLeastPrivilege(t *testing.T) {
	skipHeavy(t)
	prov := sidecarBinary(t, provisionerEnv)
	resizer := sidecarBinary(t, resizerEnv)
	snapper := sidecarBinary(t, snapshotterEnv)
	snapCtrl := sidecarBinary(t, snapshotControllerEnv)
	klogToFile(t)
	// WatchList=false: the API server serves no streaming lists, as those of the older
	// Kubernetes versions the chart supports (1.30 on). The agent's informers, which ask
	// for a streaming list first (a watch with sendInitialEvents, client-go's
	// WatchListClient), then fall back to LIST and WATCH, so both verbs of its grants are
	// exercised; against a server that streams, it only watches.
	cl := startCluster(t, kubeenv.WithControllerManager(), kubeenv.WithAudit(namespace),
		kubeenv.WithAPIServerFlags("--feature-gates=WatchList=false"))
	if cl.env.AuditLog == "" {
		t.Fatal("kubeenv.WithAudit gave no audit log")
	}
	// Each flow stops what it started (and the sidecars release their leases) when its
	// subtest ends, so the log then holds every request of the run.
	flows := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"PVCFlow", func(t *testing.T) { pvcFlow(t, cl, prov, resizer) }},
		{"ControllerAgent", func(t *testing.T) { controllerAgentFlow(t, cl) }},
		{"CapacityWithoutTopology", func(t *testing.T) { capacityWithoutTopology(t, cl) }},
		{"SnapshotFlow", func(t *testing.T) { snapshotFlow(t, cl, prov, snapper, snapCtrl) }},
		{"RarePaths", func(t *testing.T) { rarePaths(t, cl, prov, resizer) }},
	}
	flowsOK, ran := true, 0
	for _, f := range flows {
		flowsOK = t.Run(f.name, func(t *testing.T) { ran++; f.run(t) }) && flowsOK
	}
	if ran < len(flows) {
		// -run picked some flows (e.g. TestRBACLeastPrivilege/PVCFlow): the grants that the
		// others use would show as unused, so there is nothing to check.
		t.Logf("the audit check needs every flow: %d of %d ran", ran, len(flows))
		return
	}

	used, err := readAudit(cl.env.AuditLog)
	if err != nil {
		t.Fatalf("audit log %s: %v", cl.env.AuditLog, err)
	}
	grants := chartGrants(t)
	for _, sa := range []string{controllerSA, nodeSA} {
		user := "system:serviceaccount:" + namespace + ":" + sa
		checkServiceAccount(t, sa, used[user], grants[sa], flowsOK)
	}
	secretsUntouched(t, used)
	for user := range used {
		if !strings.HasPrefix(user, "system:serviceaccount:"+namespace+":") {
			t.Errorf("audit log: requests of %s, outside the policy of kubeenv.WithAudit(%q)", user, namespace)
		}
	}
}

// access is what the authorizer decides on: API group, resource (with "/subresource"),
// verb. A non-resource request has the URL path as resource and group "".
type access struct {
	group, resource, verb string
}

func (a access) String() string {
	g := a.group
	if g == "" {
		g = `""`
	}
	return fmt.Sprintf("%s %s (group %s)", a.verb, a.resource, g)
}

// usage is what one ServiceAccount did with one access.
type usage struct {
	requests   int                 // distinct requests (audit IDs)
	namespaces map[string]bool     // where ("" cluster scope)
	denied     []string            // the denied requests, as method and URI
	clients    map[string]bool     // user agents, program name only
	ids        map[string]struct{} // audit IDs seen
}

// auditEvent is the part of an audit.k8s.io/v1 Event that the test reads.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Annotations map[string]string `json:"annotations"`
}

// readAudit reads the JSON-lines audit log at path into, per user, what each access was
// used for.
func readAudit(path string) (map[string]map[access]*usage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]map[access]*usage{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		a := access{resource: strings.SplitN(e.RequestURI, "?", 2)[0], verb: e.Verb}
		ns := ""
		if r := e.ObjectRef; r != nil && r.Resource != "" {
			a.group, a.resource, ns = r.APIGroup, r.Resource, r.Namespace
			if r.Subresource != "" {
				a.resource += "/" + r.Subresource
			}
		}
		if out[e.User.Username] == nil {
			out[e.User.Username] = map[access]*usage{}
		}
		u := out[e.User.Username][a]
		if u == nil {
			u = &usage{namespaces: map[string]bool{}, clients: map[string]bool{}, ids: map[string]struct{}{}}
			out[e.User.Username][a] = u
		}
		if _, seen := u.ids[e.AuditID]; !seen {
			u.ids[e.AuditID] = struct{}{}
			u.requests++
		}
		u.namespaces[ns] = true
		u.clients[strings.SplitN(e.UserAgent, "/", 2)[0]] = true
		if (e.ResponseStatus != nil && e.ResponseStatus.Code == 403) || e.Annotations["authorization.k8s.io/decision"] == "forbid" {
			u.denied = append(u.denied, e.Verb+" "+e.RequestURI)
		}
	}
	return out, sc.Err()
}

// grant is one (group, resource, verb) that a chart Role or ClusterRole gives a
// ServiceAccount through one binding.
type grant struct {
	access
	// role is "ClusterRole name" or "Role name"; binding is "Kind name" of the binding.
	role, binding string
	// namespace is where it applies: a Role's or RoleBinding's namespace, "" everywhere.
	namespace string
}

// chartGrants reads deploy/raid10-csi.yaml and returns, per ServiceAccount of the release
// namespace, every grant of every role bound to it. A wildcard, resourceNames or
// nonResourceURLs rule fails the test: the chart grants none, and this check could not
// prove one used.
func chartGrants(t *testing.T) map[string][]grant {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string][]rbacv1.PolicyRule{} // "Role ns/name" or "ClusterRole name"
	var bindings []struct {
		kind, namespace string
		b               rbacv1.RoleBinding // a ClusterRoleBinding has the same subjects and roleRef
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var u unstructured.Unstructured
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", manifest, err)
		}
		switch u.GetKind() {
		case "Role", "ClusterRole":
			var r rbacv1.Role
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
				t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
			}
			roles[roleKey(u.GetKind(), u.GetNamespace(), u.GetName())] = r.Rules
		case "RoleBinding", "ClusterRoleBinding":
			var b rbacv1.RoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
				t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
			}
			bindings = append(bindings, struct {
				kind, namespace string
				b               rbacv1.RoleBinding
			}{u.GetKind(), u.GetNamespace(), b})
		}
	}
	out := map[string][]grant{}
	for _, bd := range bindings {
		ref := bd.b.RoleRef
		rules, ok := roles[roleKey(ref.Kind, bd.namespace, ref.Name)]
		if !ok {
			t.Fatalf("%s %s binds %s %s, which %s does not define", bd.kind, bd.b.Name, ref.Kind, ref.Name, manifest)
		}
		role, binding := ref.Kind+" "+ref.Name, bd.kind+" "+bd.b.Name
		by := role + " (" + binding + ")"
		for _, s := range bd.b.Subjects {
			if s.Kind != rbacv1.ServiceAccountKind || s.Namespace != namespace {
				t.Fatalf("%s %s binds %s %s/%s: not a ServiceAccount of the release namespace %s", bd.kind, bd.b.Name, s.Kind, s.Namespace, s.Name, namespace)
			}
			for _, r := range rules {
				if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
					t.Fatalf("ServiceAccount %s: %s has a rule with resourceNames or nonResourceURLs (%+v), which this test cannot check", s.Name, by, r)
				}
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							if g == rbacv1.APIGroupAll || res == rbacv1.ResourceAll || v == rbacv1.VerbAll {
								t.Fatalf("ServiceAccount %s: %s grants the wildcard %s %s (group %q): name what is used", s.Name, by, v, res, g)
							}
							out[s.Name] = append(out[s.Name], grant{access{g, res, v}, role, binding, bd.namespace})
						}
					}
				}
			}
		}
	}
	return out
}

func roleKey(kind, namespace, name string) string {
	if kind == "ClusterRole" {
		return kind + " " + name
	}
	return kind + " " + namespace + "/" + name
}

// checkServiceAccount fails t for every denied request of the ServiceAccount sa and, when
// the flows passed (coverage), for every grant that was neither used nor listed in
// unexercised, and logs the table of used and granted accesses.
func checkServiceAccount(t *testing.T, sa string, used map[access]*usage, grants []grant, coverage bool) {
	t.Helper()
	if len(used) == 0 {
		t.Errorf("ServiceAccount %s: no request in the audit log; is auditing on?", sa)
	}
	for a, u := range used {
		for _, d := range u.denied {
			t.Errorf("ServiceAccount %s: %s denied (403): %s; the chart must grant it", sa, a, d)
		}
	}

	// allowed: the entries of unexercised by role and access.
	type roleAccess struct {
		role string
		access
	}
	allowed := map[roleAccess]string{}
	for _, e := range unexercised[sa] {
		allowed[roleAccess{e.role, access{e.group, e.resource, e.verb}}] = e.reason
	}
	// usedBy reports whether g was used in its namespace ("" anywhere) by its role's client.
	usedBy := func(g grant) bool {
		u := used[g.access]
		if u == nil || (g.namespace != "" && !u.namespaces[g.namespace]) {
			return false
		}
		c, ok := roleClients[g.role]
		return !ok || u.clients[c]
	}

	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "VERB\tRESOURCE\tGROUP\tREQUESTS\tCLIENTS\tGRANTED BY\tCHECK")
	granted := map[access]bool{}
	grantedRA := map[roleAccess]bool{}
	for _, g := range grants {
		granted[g.access] = true
		ra := roleAccess{g.role, g.access}
		grantedRA[ra] = true
		scope := g.role + " (" + g.binding + ")"
		if g.namespace != "" {
			scope += " in " + g.namespace
		}
		if c, ok := roleClients[g.role]; ok {
			scope += " for " + c
		}
		check := "used"
		switch reason, listed := allowed[ra]; {
		case usedBy(g) && listed:
			check = "USED BUT ALLOW-LISTED"
			t.Errorf("ServiceAccount %s: %s, granted by %s, is used but listed in unexercised (%s): remove the entry", sa, g.access, scope, reason)
		case usedBy(g):
		case listed:
			check = "needed, not exercised: " + reason
		default:
			check = "UNUSED"
			if coverage {
				t.Errorf("ServiceAccount %s: %s, granted by %s, was never used: remove it from the chart, or list it in unexercised with the reason", sa, g.access, scope)
			}
		}
		group := g.group
		if group == "" {
			group = "core"
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", g.verb, g.resource, group, requests(used[g.access]), clients(used[g.access]), scope, check)
	}
	for ra, reason := range allowed {
		if !grantedRA[ra] {
			t.Errorf("ServiceAccount %s: %s is listed in unexercised for %s (%s) but that role does not grant it: remove the entry", sa, ra.access, ra.role, reason)
		}
	}
	// What it used that the chart does not grant: discovery and the like, allowed to every
	// authenticated user by the API server's default roles.
	var rest []access
	for a := range used {
		if !granted[a] {
			rest = append(rest, a)
		}
	}
	slices.SortFunc(rest, func(x, y access) int { return strings.Compare(x.String(), y.String()) })
	for _, a := range rest {
		group := a.group
		if group == "" && strings.HasPrefix(a.resource, "/") {
			group = "-"
		} else if group == "" {
			group = "core"
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", a.verb, a.resource, group, requests(used[a]), clients(used[a]), "(default roles)", "not from the chart")
	}
	_ = tw.Flush()
	t.Logf("ServiceAccount %s/%s: what it used and what the chart grants it:\n%s", namespace, sa, b.String())
	if !coverage {
		t.Logf("ServiceAccount %s: a flow failed, so unused grants are not failures in this run", sa)
	}
}

func requests(u *usage) int {
	if u == nil {
		return 0
	}
	return u.requests
}

func clients(u *usage) string {
	if u == nil {
		return "-"
	}
	var cs []string
	for c := range u.clients {
		cs = append(cs, c)
	}
	slices.Sort(cs)
	return strings.Join(cs, ",")
}

// capacityWithoutTopology asks the controller for the capacity of the whole cluster, as a
// GetCapacity without topology does (and a CreateVolume without one, to pick a node): the
// controller lists the Raid10Nodes, which no flow with topology does.
func capacityWithoutTopology(t *testing.T, cl *cluster) {
	sock := cl.startController(t, 10*time.Second)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := csi.NewControllerClient(conn).GetCapacity(t.Context(), &csi.GetCapacityRequest{})
	if err != nil {
		t.Fatalf("GetCapacity without topology: %v", err)
	}
	// The flows' agents are gone, their Raid10Nodes stay: each reported free space.
	if resp.GetAvailableCapacity() <= 0 {
		t.Fatalf("GetCapacity without topology: %v, want the free space of the Raid10Nodes the flows left", resp)
	}
	t.Logf("GetCapacity without topology: %d bytes available", resp.GetAvailableCapacity())
}

// rarePaths runs, against a new node whose pool is too small for the claims, the paths
// that a successful claim never takes:
//
//   - csi-provisioner finds the owner of its CSIStorageCapacity objects as the chart runs
//     it (--capacity-ownerref-level=2): its Pod, then the Pod's ReplicaSet (get of both);
//   - a claim that does not fit on its selected node is rescheduled (the provisioner drops
//     the annotation: update of the claim) and, annotated again, fails again (the same
//     Event: patch of its count);
//   - an expansion that does not fit fails and is retried (csi-resizer's repeated Event:
//     patch);
//   - two disks that fail at once make the agent record DiskFailed twice on one version of
//     its Raid10Node (a series: patch of the events.k8s.io Event);
//   - the StorageClass's deletion makes the provisioner delete its CSIStorageCapacity
//     objects.
//
// It deletes the chart's StorageClass: run it last.
func rarePaths(t *testing.T, cl *cluster, prov, resizer string) {
	const (
		node     = "node-rare"
		diskSize = 64 << 20
		fits     = 16 << 20
		tooBig   = 1 << 30
	)
	ctx := t.Context()
	cl.registerNode(t, node)
	pl, paths := filePool(t, 4, 0, diskSize, 0)
	cl.startAgent(t, node, pl, 4)
	sock := cl.startController(t, 20*time.Second)
	kubeconfig := cl.env.ServiceAccountKubeconfig(t, namespace, controllerSA)
	// No leader election: pvcFlow's sidecars used the leases already and left them held
	// (they do not release them when stopped), so a new leader would wait 15 s for them to
	// expire.
	common := []string{"--csi-address=" + sock, "--kubeconfig=" + kubeconfig, "--timeout=30s",
		"--leader-election=false", "--retry-interval-start=500ms", "--retry-interval-max=2s", "--v=5"}
	// As in pvcFlow, but with the chart's --capacity-ownerref-level=2: the provisioner finds
	// the Deployment that owns its CSIStorageCapacity objects from its own Pod (POD_NAME)
	// through the Pod's ReplicaSet. kube-controller-manager makes that Pod and ReplicaSet
	// from a Deployment; no kubelet runs the Pod, the sidecar runs here under its name.
	pod := ownedPod(t, cl, "raid10-csi-controller")
	provisioner := startSidecar(t, "csi-provisioner", prov,
		[]string{"NAMESPACE=" + namespace, "POD_NAME=" + pod},
		append([]string{"--feature-gates=Topology=true", "--enable-capacity=true", "--capacity-ownerref-level=2",
			"--capacity-poll-interval=2s", "--extra-create-metadata=true", "--default-fstype=ext4", "--node-deployment=false"}, common...)...)
	resizerProc := startSidecar(t, "csi-resizer", resizer, []string{"NAMESPACE=" + namespace}, common...)
	exited := func() string { return provisioner.exited() + resizerProc.exited() }

	claim := func(name string, size int64) *corev1.PersistentVolumeClaim {
		sc := storageClass
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault,
				Annotations: map[string]string{selectedNodeAnnotation: node}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &sc,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI),
				}},
			},
		}
		if err := cl.c.Create(ctx, pvc); err != nil {
			t.Fatalf("create PVC %s: %v", name, err)
		}
		return pvc
	}
	// repeated waits until an Event with reason about the claim has counted at least two.
	repeated := func(pvc *corev1.PersistentVolumeClaim, reason string) {
		t.Helper()
		d := waitFor(t, time.Minute, "Event "+reason+" repeated for PVC "+pvc.Name, func() (bool, string) {
			var l corev1.EventList
			if err := cl.c.List(ctx, &l, client.InNamespace(pvc.Namespace)); err != nil {
				return false, err.Error()
			}
			for _, e := range l.Items {
				if e.InvolvedObject.UID == pvc.UID && e.Reason == reason && e.Count >= 2 {
					return true, ""
				}
			}
			return false, cl.events(t, pvc.Namespace, pvc.Name) + exited()
		})
		t.Logf("Event %s for PVC %s repeated (count patched) after %v", reason, pvc.Name, d.Round(time.Millisecond))
	}

	// A claim that does not fit: rescheduled, twice.
	big := claim("too-big", tooBig)
	for i := range 2 {
		d := waitFor(t, time.Minute, "PVC too-big rescheduled", func() (bool, string) {
			if err := cl.c.Get(ctx, client.ObjectKeyFromObject(big), big); err != nil {
				return false, err.Error()
			}
			_, selected := big.Annotations[selectedNodeAnnotation]
			return !selected, fmt.Sprintf("annotations %v; events: %s%s", big.Annotations, cl.events(t, big.Namespace, big.Name), exited())
		})
		t.Logf("PVC too-big (%d MiB, pool of 4 x %d MiB) rescheduled by csi-provisioner after %v", tooBig>>20, diskSize>>20, d.Round(time.Millisecond))
		if i == 0 {
			// What the scheduler would do next, were node-rare its only choice.
			again := big.DeepCopy()
			again.Annotations[selectedNodeAnnotation] = node
			if err := cl.c.Patch(ctx, again, client.MergeFrom(big)); err != nil {
				t.Fatalf("annotate PVC too-big again: %v", err)
			}
		}
	}
	repeated(big, "ProvisioningFailed")

	// An expansion that does not fit: retried.
	small := claim("fits", fits)
	waitFor(t, time.Minute, "PVC fits Bound", func() (bool, string) {
		if err := cl.c.Get(ctx, client.ObjectKeyFromObject(small), small); err != nil {
			return false, err.Error()
		}
		return small.Status.Phase == corev1.ClaimBound, fmt.Sprintf("phase %s; events: %s%s", small.Status.Phase, cl.events(t, small.Namespace, small.Name), exited())
	})
	grown := small.DeepCopy()
	grown.Spec.Resources.Requests[corev1.ResourceStorage] = *resource.NewQuantity(tooBig, resource.BinarySI)
	if err := cl.c.Patch(ctx, grown, client.MergeFrom(small)); err != nil {
		t.Fatalf("grow PVC fits to %d bytes: %v", int64(tooBig), err)
	}
	repeated(small, "VolumeResizeFailed")

	// Two disks fail at once: the agent's next poll records DiskFailed twice on the same
	// Raid10Node (same version), and its events.k8s.io recorder patches the first Event into
	// a series. The patch can reach the API server before the Event's create: it then fails
	// NotFound and the recorder tries again 10 s later. What counts here is the patch
	// request, so the wait ends when the audit log has it. Should a poll fall between the two
	// failures (two versions, no series), the other two disks fail next.
	nodeUser := "system:serviceaccount:" + namespace + ":" + nodeSA
	patched := func() bool {
		used, err := readAudit(cl.env.AuditLog)
		return err == nil && used[nodeUser][access{"events.k8s.io", "events", "patch"}] != nil
	}
	for i := 0; i < 2 && !patched(); i++ {
		for _, p := range []string{paths[i], paths[i+2]} {
			if err := pl.FailDisk(p); err != nil {
				t.Fatalf("FailDisk %s: %v", p, err)
			}
		}
		d := waitFor(t, 15*time.Second, "DiskFailed Events on Raid10Node "+node, func() (bool, string) {
			var l eventsv1.EventList
			if err := cl.c.List(ctx, &l); err != nil {
				return false, err.Error()
			}
			failed := 0
			for _, e := range l.Items {
				if e.Regarding.Kind == "Raid10Node" && e.Regarding.Name == node && e.Reason == agent.EventDiskFailed {
					failed++
				}
			}
			return patched() || failed >= 2*(i+1), fmt.Sprintf("%d DiskFailed Events, no patch in the audit log", failed)
		})
		t.Logf("agent: disks %s and %s failed; DiskFailed recorded after %v, series patch sent: %v", paths[i], paths[i+2], d.Round(time.Millisecond), patched())
	}
	if !patched() {
		t.Fatalf("Raid10Node %s: two disks failed at once, twice, and the agent never patched a DiskFailed Event into a series", node)
	}

	// The CSIStorageCapacity of node-rare is owned by the Deployment.
	waitFor(t, time.Minute, "CSIStorageCapacity of "+node+" owned by Deployment raid10-csi-controller", func() (bool, string) {
		var l storagev1.CSIStorageCapacityList
		if err := cl.c.List(ctx, &l, client.InNamespace(namespace)); err != nil {
			return false, err.Error()
		}
		var all []string
		for _, c := range l.Items {
			owners := c.OwnerReferences
			all = append(all, fmt.Sprintf("%s: topology %v, owners %v", c.Name, c.NodeTopology, owners))
			if c.NodeTopology != nil && c.NodeTopology.MatchLabels[v1alpha1.TopologyNodeKey] == node &&
				len(owners) == 1 && owners[0].Kind == "Deployment" && owners[0].Name == "raid10-csi-controller" {
				return true, ""
			}
		}
		return false, fmt.Sprint(all) + exited()
	})

	// The StorageClass goes: its CSIStorageCapacity objects go with it.
	var sc storagev1.StorageClass
	if err := cl.c.Get(ctx, client.ObjectKey{Name: storageClass}, &sc); err != nil {
		t.Fatal(err)
	}
	if err := cl.c.Delete(ctx, &sc); err != nil {
		t.Fatalf("delete StorageClass %s: %v", storageClass, err)
	}
	d := waitFor(t, time.Minute, "CSIStorageCapacity objects deleted with the StorageClass", func() (bool, string) {
		var l storagev1.CSIStorageCapacityList
		if err := cl.c.List(ctx, &l, client.InNamespace(namespace)); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d left%s", len(l.Items), exited())
	})
	t.Logf("csi-provisioner deleted the CSIStorageCapacity objects of StorageClass %s %v after its deletion", storageClass, d.Round(time.Millisecond))
}

// ownedPod creates, as the admin, the Deployment name in the release namespace (one
// replica, the chart's controller ServiceAccount) and returns the name of the Pod that
// kube-controller-manager makes for it through a ReplicaSet. The Pod stays Pending: nothing
// schedules or runs it.
func ownedPod(t *testing.T, cl *cluster, name string) string {
	t.Helper()
	ctx := t.Context()
	labels := map[string]string{"app.kubernetes.io/name": name}
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: controllerSA,
					Containers:         []corev1.Container{{Name: "csi-provisioner", Image: "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0"}},
				},
			},
		},
	}
	if err := cl.c.Create(ctx, dep); err != nil {
		t.Fatalf("create Deployment %s: %v", name, err)
	}
	var pod string
	waitFor(t, time.Minute, "a Pod of Deployment "+name+" through its ReplicaSet", func() (bool, string) {
		var l corev1.PodList
		if err := cl.c.List(ctx, &l, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
			return false, err.Error()
		}
		for _, p := range l.Items {
			if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "ReplicaSet" {
				pod = p.Name
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d Pods", len(l.Items))
	})
	return pod
}
