package scale

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// claimsNamespace holds the claims and pods of claims.
const claimsNamespace = "scale-claims"

// claimsPlane is what a cluster needs for claims to go the way a user's go: kube-scheduler
// (it picks each pod's node from the CSIStorageCapacity objects, WaitForFirstConsumer) and
// of kube-controller-manager only the PV binder and the two protection controllers. The
// node lifecycle controller would taint every hollow node, since none renews its status.
// sched sets kube-scheduler's configuration.
func claimsPlane(sched kubeenv.SchedulerConfig) []kubeenv.Option {
	return []kubeenv.Option{kubeenv.WithSchedulerConfig(sched), kubeenv.WithControllers(
		"persistentvolume-binder-controller", "persistentvolumeclaim-protection-controller",
		"persistentvolume-protection-controller")}
}

// claimsResult is one step's claims: n claims (WaitForFirstConsumer: each with a pod),
// created and deleted.
type claimsResult struct {
	immediate     bool // Immediate binding, no pods; else WaitForFirstConsumer with pods
	nodes, claims int
	boundRate     float64       // claims Bound (and their pods bound) per second
	p50, p99      time.Duration // from a claim's creation to Bound with its pod on a node
	deleteRate    float64       // claims deleted, their PVs and volumes gone, per second
	perNode       [2]int        // fewest and most claims on one node
	sched         schedDelta    // what kube-scheduler spent on the claims' pods
}

// claims creates n claims of the bench's StorageClass, each with a pod that mounts it, with
// workers creating at a time, and waits for each pod to be bound by kube-scheduler (which
// picked the node from the CSIStorageCapacity objects), each claim to be Bound
// (csi-provisioner's CreateVolume on that node, the PV binder) and each Raid10Volume to be
// Ready on the pod's node (the hollow agent allocated it). Then it deletes the pods
// (nothing runs them: no kubelet) and the claims, and waits until every PV and
// Raid10Volume is gone (DeleteVolume, reclaim policy Delete). The cluster needs
// claimsPlane. With immediate the claims are of classImmediate (made for them, deleted
// after) and have no pods: csi-provisioner provisions each at once, offering every node's
// topology, and the controller picks the node.
func (cl *cluster) claims(t *testing.T, immediate bool, n, workers int, size string, timeout time.Duration) claimsResult {
	t.Helper()
	ctx := t.Context()
	r := claimsResult{immediate: immediate, nodes: len(cl.nodes), claims: n}
	sc, prefix := class, fmt.Sprintf("c%d-", len(cl.nodes))
	if immediate {
		sc, prefix = classImmediate, fmt.Sprintf("i%d-", len(cl.nodes))
		imm := storageClass(classImmediate, storagev1.VolumeBindingImmediate)
		if err := cl.c.Create(ctx, imm); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create StorageClass %s: %v", classImmediate, err)
		}
		defer func() {
			if err := cl.c.Delete(context.Background(), imm); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete StorageClass %s: %v", classImmediate, err)
			}
		}()
	}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: claimsNamespace}},
		// The ServiceAccount admission wants it; its controller does not run here.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: claimsNamespace}},
	} {
		if err := cl.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	sched0, cpu0 := cl.schedMetrics(t), cpuSeconds()
	type profiled struct{ path, top string }
	profile := make(chan profiled, 1)
	if dir := os.Getenv(envProfile); dir != "" && cl.sched.Profiling && !immediate {
		// Within the claims at any size of interest (at 1,000 nodes they take minutes).
		go func() {
			path, top, err := cl.schedProfile(t, dir, 20)
			if err != nil {
				t.Errorf("kube-scheduler's CPU profile: %v", err)
			}
			profile <- profiled{path, top}
		}()
	} else {
		profile <- profiled{}
	}
	created := make([]time.Time, n)
	var mu sync.Mutex
	start := time.Now()
	parallel(n, workers, func(i int) error {
		name := fmt.Sprintf("%s%05d", prefix, i)
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimsNamespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &sc,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
			},
		}
		zero := int64(0)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimsNamespace},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "db", Image: "registry.k8s.io/pause:3.10",
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
				TerminationGracePeriodSeconds: &zero,
			},
		}
		mu.Lock()
		created[i] = time.Now()
		mu.Unlock()
		if err := cl.c.Create(ctx, pvc); err != nil {
			return fmt.Errorf("claim %s: %w", name, err)
		}
		if immediate {
			return nil
		}
		if err := cl.c.Create(ctx, pod); err != nil {
			return fmt.Errorf("pod %s: %w", name, err)
		}
		return nil
	}, t)

	// Bound: the pod on a node, the claim Bound to a PV, the PV's volume Ready on that node.
	done := make([]time.Duration, n)
	boundAt := map[string]time.Time{}
	// Polled every 500 ms: three lists of n objects, which the API server serves too.
	waitEvery(t, 500*time.Millisecond, timeout, fmt.Sprintf("%d claims Bound with their pods on nodes", n), func() (bool, string) {
		var pvcs corev1.PersistentVolumeClaimList
		var pods corev1.PodList
		var vols v1alpha1.Raid10VolumeList
		if err := cl.c.List(ctx, &pvcs, client.InNamespace(claimsNamespace)); err != nil {
			return false, err.Error()
		}
		if err := cl.c.List(ctx, &pods, client.InNamespace(claimsNamespace)); err != nil {
			return false, err.Error()
		}
		if err := cl.c.List(ctx, &vols); err != nil {
			return false, err.Error()
		}
		now := time.Now()
		podNode, unscheduled := map[string]string{}, map[string]string{}
		for _, p := range pods.Items {
			podNode[p.Name] = p.Spec.NodeName
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
					unscheduled[p.Name] = c.Message
				}
			}
		}
		ready := map[string]string{} // PV name (the volume ID) -> node
		for _, v := range vols.Items {
			if v.Status.Phase == v1alpha1.VolumePhaseReady {
				ready[v.Name] = v.Spec.Node
			}
		}
		waiting := ""
		for _, c := range pvcs.Items {
			if _, ok := boundAt[c.Name]; ok || !strings.HasPrefix(c.Name, prefix) {
				continue
			}
			node := podNode[c.Name]
			if immediate {
				node = ready[c.Spec.VolumeName] // no pod: the node the controller picked
			}
			if c.Status.Phase == corev1.ClaimBound && node != "" && ready[c.Spec.VolumeName] == node {
				boundAt[c.Name] = now
			} else if waiting == "" {
				waiting = fmt.Sprintf("; claim %s: %s, selected node %q, volume %q, pod on %q (unscheduled: %q)", c.Name, c.Status.Phase,
					c.Annotations["volume.kubernetes.io/selected-node"], c.Spec.VolumeName, node, unscheduled[c.Name])
			}
		}
		return len(boundAt) == n, fmt.Sprintf("%d of %d%s", len(boundAt), n, waiting)
	})
	bound := time.Since(start)
	r.sched = sched0.delta(cl.schedMetrics(t))
	r.sched.percentageOfScored, r.sched.binary = cl.sched.PercentageOfNodesToScore, cl.sched.Binary
	if r.sched.attempts > 0 {
		r.sched.cpuPerPod = time.Duration((cpuSeconds()["kube-scheduler"] - cpu0["kube-scheduler"]) / float64(r.sched.attempts) * float64(time.Second))
	}
	p := <-profile
	r.sched.profile, r.sched.profileTop = p.path, p.top
	perNode := map[string]int{}
	var pods corev1.PodList
	if err := cl.c.List(ctx, &pods, client.InNamespace(claimsNamespace)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		perNode[p.Spec.NodeName]++
	}
	if immediate {
		var vols v1alpha1.Raid10VolumeList
		if err := cl.c.List(ctx, &vols); err != nil {
			t.Fatal(err)
		}
		for _, v := range vols.Items {
			perNode[v.Spec.Node]++
		}
	}
	counts := []int{}
	for _, nd := range cl.nodes {
		counts = append(counts, perNode[nd.Name])
	}
	sort.Ints(counts)
	r.perNode = [2]int{counts[0], counts[len(counts)-1]}
	for i := range n {
		done[i] = boundAt[fmt.Sprintf("%s%05d", prefix, i)].Sub(created[i])
	}
	r.boundRate = float64(n) / bound.Seconds()
	r.p50, r.p99 = quantile(done, 0.5), quantile(done, 0.99)

	// Delete: the pods at once (no kubelet to wait for), then the claims; the PVs go with
	// DeleteVolume.
	start = time.Now()
	parallel(n, workers, func(i int) error {
		name := fmt.Sprintf("%s%05d", prefix, i)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimsNamespace}}
		if err := cl.c.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimsNamespace}}
		if err := cl.c.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}, t)
	waitEvery(t, 500*time.Millisecond, timeout, "the claims' PVs and volumes deleted", func() (bool, string) {
		var pvs corev1.PersistentVolumeList
		var vols v1alpha1.Raid10VolumeList
		var pvcs corev1.PersistentVolumeClaimList
		for _, l := range []client.ObjectList{&pvs, &vols, &pvcs} {
			if err := cl.c.List(ctx, l); err != nil {
				return false, err.Error()
			}
		}
		return len(pvs.Items) == 0 && len(vols.Items) == 0 && len(pvcs.Items) == 0,
			fmt.Sprintf("%d claims, %d PVs, %d Raid10Volumes left", len(pvcs.Items), len(pvs.Items), len(vols.Items))
	})
	r.deleteRate = float64(n) / time.Since(start).Seconds()
	return r
}

// claimsTable is the markdown table of the steps' claims.
func claimsTable(rows []claimsResult) string {
	var b strings.Builder
	b.WriteString("| nodes | binding | claims | Bound/s | claim to Bound p50 | p99 | deleted/s | claims per node (min-max) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	for _, r := range rows {
		binding := "WaitForFirstConsumer, each with a pod"
		if r.immediate {
			binding = "Immediate, no pod"
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %.1f | %s | %s | %.1f | %d-%d |\n",
			r.nodes, binding, r.claims, r.boundRate, ms(r.p50), ms(r.p99), r.deleteRate, r.perNode[0], r.perNode[1])
	}
	return b.String()
}

// TestHollowClaims: claims go the way a user's go on hollow nodes, through the real
// kube-scheduler, csi-provisioner and PV binder: four nodes, twelve claims each with a
// pod, all Bound with their volumes Ready on the nodes the scheduler picked, spread over
// the nodes (the scheduler read the CSIStorageCapacity objects and the CSINodes' limits),
// then deleted with nothing left.
func TestHollowClaims(t *testing.T) {
	cl := startClusterWith(t, 5*time.Second, "", benchLimits(t), claimsPlane(kubeenv.SchedulerConfig{})...)
	nodes := cl.addNodes(t, 4)
	cl.reported(t, nodes, 5*time.Minute)
	r := cl.claims(t, false, 12, 4, "1Gi", 3*time.Minute)
	imm := cl.claims(t, true, 12, 4, "1Gi", 3*time.Minute)
	t.Logf("\n%s\n%s", claimsTable([]claimsResult{r, imm}), schedTable([]claimsResult{r, imm}))
	if imm.perNode[1] == 12 {
		t.Errorf("every Immediate claim went to one node: the controller did not spread them (%v)", imm.perNode)
	}
	if imm.sched.attempts != 0 {
		t.Errorf("kube-scheduler scheduled %d pods for the Immediate claims, which have none", imm.sched.attempts)
	}
	if r.sched.attempts < 12 || r.sched.filterMean <= 0 || r.sched.algorithmMean < r.sched.filterMean {
		t.Errorf("kube-scheduler's metrics show %d pods scheduled (Filter %v per pod), want the 12 claims' pods, their algorithm at least their Filter (%v)", r.sched.attempts, r.sched.filterMean, r.sched.algorithmMean)
	}
	if r.perNode[1] == 12 {
		t.Errorf("every claim went to one node: the scheduler did not spread them (%v)", r.perNode)
	}
	var events corev1.EventList
	if err := cl.c.List(context.Background(), &events, client.InNamespace(claimsNamespace)); err == nil {
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason != "FailedScheduling" {
				t.Logf("warning event: %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
}
