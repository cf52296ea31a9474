package main

// Rendering of cluster mode: Raid10Nodes, Raid10Volumes and Raid10Snapshots as tables in the
// manner of kubectl get, or as Kubernetes Lists with -o json|yaml. describe volume is in
// render_describe.go.

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// clusterOverview is what status prints with -o json|yaml.
type clusterOverview struct {
	Nodes   []nodeSummary   `json:"nodes"`
	Volumes []volumeSummary `json:"volumes"`
}

// nodeSummary is a node's line of status.
type nodeSummary struct {
	Name         string `json:"name"`
	Disks        int32  `json:"disks"`
	HealthyDisks int32  `json:"healthyDisks"`
	UsableBytes  int64  `json:"usableBytes"`
	FreeBytes    int64  `json:"freeBytes"`
	Ready        string `json:"ready"`
}

// volumeSummary is a volume's line of status.
type volumeSummary struct {
	Name   string                `json:"name"`
	Node   string                `json:"node"`
	Size   int64                 `json:"sizeBytes"`
	Phase  v1alpha1.VolumePhase  `json:"phase,omitempty"`
	Health v1alpha1.VolumeHealth `json:"health,omitempty"`
	InSync string                `json:"inSync,omitempty"`
	// BadBlocks and LostBlocks are the status's counts.
	BadBlocks  int64                     `json:"badBlocks"`
	LostBlocks int64                     `json:"lostBlocks"`
	Rebuild    *v1alpha1.RebuildProgress `json:"rebuild,omitempty"`
	Message    string                    `json:"message,omitempty"`
}

// healthRank orders volumes for status: the ones that need attention first.
func healthRank(v v1alpha1.Raid10Volume) int {
	switch {
	case v.Status.Health == v1alpha1.VolumeHealthFailed || v.Status.Phase == v1alpha1.VolumePhaseFailed:
		return 0
	case v.Status.Health == v1alpha1.VolumeHealthDegraded:
		return 1
	case v.Status.Health == v1alpha1.VolumeHealthRebuilding || v.Status.Rebuild != nil:
		return 2
	case v.Status.Health == v1alpha1.VolumeHealthHealthy:
		return 4
	}
	return 3 // not reported yet, Pending, Expanding
}

// conditionStatus is the status of condition t, "Unknown" when it is not set.
func conditionStatus(conds []metav1.Condition, t string) string {
	for _, c := range conds {
		if c.Type == t {
			return string(c.Status)
		}
	}
	return "Unknown"
}

// volumeSize is a volume's capacity, its requested size until the agent reports one.
func volumeSize(v *v1alpha1.Raid10Volume) string {
	if v.Status.Capacity != nil {
		return human(uint64(v.Status.Capacity.Value()))
	}
	return human(uint64(v.Spec.SizeBytes))
}

// overview sums up the nodes and the volumes for status, in the order given.
func overview(nodes []v1alpha1.Raid10Node, vols []v1alpha1.Raid10Volume) clusterOverview {
	ov := clusterOverview{Nodes: []nodeSummary{}, Volumes: []volumeSummary{}}
	for _, n := range nodes {
		ov.Nodes = append(ov.Nodes, nodeSummary{
			Name: n.Name, Disks: n.Status.DiskCount, HealthyDisks: n.Status.HealthyDisks,
			UsableBytes: n.Status.Capacity.Usable.Value(), FreeBytes: n.Status.Capacity.Free.Value(),
			Ready: conditionStatus(n.Status.Conditions, v1alpha1.ConditionReady),
		})
	}
	for i := range vols {
		v := &vols[i]
		ov.Volumes = append(ov.Volumes, volumeSummary{
			Name: v.Name, Node: v.Spec.Node, Size: v.Spec.SizeBytes, Phase: v.Status.Phase, Health: v.Status.Health,
			InSync: v.Status.InSync, BadBlocks: v.Status.BadBlocks, LostBlocks: v.Status.LostBlocks,
			Rebuild: v.Status.Rebuild, Message: v.Status.Message,
		})
	}
	return ov
}

// clusterStatus prints the nodes (disks healthy/total, usable, free) and the volumes, the
// failed, degraded and rebuilding ones first.
func (r renderer) clusterStatus(nodes []v1alpha1.Raid10Node, vols []v1alpha1.Raid10Volume, now time.Time) error {
	slices.SortStableFunc(vols, func(a, b v1alpha1.Raid10Volume) int { return healthRank(a) - healthRank(b) })
	ov := overview(nodes, vols)
	if ok, err := r.structured(ov); ok {
		return err
	}
	var disks, healthy int32
	for _, n := range ov.Nodes {
		disks += n.Disks
		healthy += n.HealthyDisks
	}
	count := map[v1alpha1.VolumeHealth]int{}
	for _, v := range vols {
		count[v.Status.Health]++
	}
	ew := &errWriter{w: r.w}
	ew.printf("%d nodes, %d/%d disks healthy; %d volumes: %d Healthy, %d Degraded, %d Rebuilding, %d Failed, %d not reported\n\n",
		len(nodes), healthy, disks, len(vols), count[v1alpha1.VolumeHealthHealthy], count[v1alpha1.VolumeHealthDegraded],
		count[v1alpha1.VolumeHealthRebuilding], count[v1alpha1.VolumeHealthFailed], count[""])
	if ew.err != nil {
		return ew.err
	}
	tw, ew := r.table()
	ew.printf("NODE\tDISKS HEALTHY\tUSABLE\tFREE\tREADY\tAGE\n")
	for i, n := range ov.Nodes {
		ew.printf("%s\t%d/%d\t%s\t%s\t%s\t%s\n", n.Name, n.HealthyDisks, n.Disks, human(uint64(n.UsableBytes)),
			human(uint64(n.FreeBytes)), n.Ready, age(nodes[i].CreationTimestamp, now))
	}
	if len(ov.Nodes) == 0 {
		ew.printf("(no Raid10Node: no node agent has reported a pool)\n")
	}
	ew.printf("\nVOLUME\tNODE\tSIZE\tHEALTH\tMEMBERS\tBAD BLOCKS\tREBUILD\tMESSAGE\n")
	for i := range vols {
		v := &vols[i]
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.Spec.Node, volumeSize(v), dash(string(v.Status.Health)),
			dash(v.Status.InSync), blocks(v.Status.BadBlocks, v.Status.LostBlocks), progressBar(v.Status.Rebuild), dash(v.Status.Message))
	}
	if len(vols) == 0 {
		ew.printf("(no Raid10Volume)\n")
	}
	return flush(tw, ew)
}

// clusterVolumes prints the volumes as `kubectl get r10v` does, with the rebuild as a bar and
// the QoS limits.
func (r renderer) clusterVolumes(vols []v1alpha1.Raid10Volume, now time.Time) error {
	if ok, err := r.structured(listOf("Raid10VolumeList", vols)); ok {
		return err
	}
	tw, ew := r.table()
	ew.printf("NAME\tNODE\tSIZE\tSTATE\tHEALTH\tMEMBERS\tBAD BLOCKS\tREBUILD\tCLAIM\tLIMITS\tENCRYPTED\tAGE\n")
	for i := range vols {
		v := &vols[i]
		claim := annotatedRef(v.Annotations, v1alpha1.PVCNamespaceAnnotation, v1alpha1.PVCNameAnnotation)
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.Spec.Node, volumeSize(v), dash(string(v.Status.Phase)),
			dash(string(v.Status.Health)), dash(v.Status.InSync), blocks(v.Status.BadBlocks, v.Status.LostBlocks),
			progressBar(v.Status.Rebuild), claim, limitsColumn(v), encryptedColumn(v), age(v.CreationTimestamp, now))
	}
	return flush(tw, ew)
}

// clusterDisks prints every node's disks.
func (r renderer) clusterDisks(nodes []v1alpha1.Raid10Node) error {
	if ok, err := r.structured(listOf("Raid10NodeList", nodes)); ok {
		return err
	}
	tw, ew := r.table()
	ew.printf("NODE\tDISK\tPATH\tSTATE\tSIZE\tFREE\tMESSAGE\n")
	for _, n := range nodes {
		if len(n.Status.Disks) == 0 {
			ew.printf("%s\t-\t-\t-\t-\t-\tno disks reported\n", n.Name)
		}
		for _, d := range n.Status.Disks {
			ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, d.ID, dash(d.Path), d.State, human(uint64(d.SizeBytes)),
				human(uint64(d.FreeBytes)), dash(d.Message))
		}
	}
	return flush(tw, ew)
}

// clusterSnapshots prints the snapshots with their copy progress, as `kubectl get r10s`.
func (r renderer) clusterSnapshots(snaps []v1alpha1.Raid10Snapshot, now time.Time) error {
	if ok, err := r.structured(listOf("Raid10SnapshotList", snaps)); ok {
		return err
	}
	tw, ew := r.table()
	ew.printf("NAME\tSOURCE\tNODE\tSTATE\tCOPY\tSIZE\tCUT\tVOLUMESNAPSHOT\tAGE\n")
	for i := range snaps {
		s := &snaps[i]
		vs := annotatedRef(s.Annotations, v1alpha1.VolumeSnapshotNamespaceAnnotation, v1alpha1.VolumeSnapshotNameAnnotation)
		cut := "-"
		if s.Status.CutAt != nil {
			cut = age(*s.Status.CutAt, now) + " ago"
		}
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Spec.Source, s.Spec.Node, dash(string(s.Status.Phase)),
			copyBar(s.Status.ReadyToUse, s.Status.Percent), human(uint64(s.Status.SizeBytes)), cut, vs, age(s.CreationTimestamp, now))
	}
	if len(snaps) == 0 {
		ew.printf("(no Raid10Snapshot)\n")
	}
	return flush(tw, ew)
}

// annotatedRef is the namespace/name of the Kubernetes object that annotations nsKey and
// nameKey lead back to (a volume's claim, a snapshot's VolumeSnapshot), "-" without a name.
func annotatedRef(annotations map[string]string, nsKey, nameKey string) string {
	if name := annotations[nameKey]; name != "" {
		return annotations[nsKey] + "/" + name
	}
	return "-"
}
