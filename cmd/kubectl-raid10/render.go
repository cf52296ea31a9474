package main

// Rendering: the tables, JSON and YAML that both modes print (local: pool.Status and its
// parts; cluster: Raid10Nodes and Raid10Volumes).

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// human formats bytes in binary units.
func human(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	v := float64(b) / float64(div)
	if v == float64(uint64(v)) {
		return fmt.Sprintf("%d%ciB", uint64(v), "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f%ciB", v, "KMGTPE"[exp])
}

// errWriter keeps the first write error, so a table is written without a check per line.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

// renderer prints results as tables or JSON.
type renderer struct {
	o *Options
	w io.Writer
}

func (r renderer) json(v any) error {
	e := json.NewEncoder(r.w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}

func (r renderer) done(msg string) error {
	if ok, err := r.structured(map[string]string{"result": msg}); ok {
		return err
	}
	_, err := fmt.Fprintln(r.w, msg)
	return err
}

func short(u string) string {
	if len(u) >= 8 {
		return u[:8]
	}
	if u == "" {
		return "-"
	}
	return u
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (r renderer) disks(ds []pool.DiskInfo) error {
	if ok, err := r.structured(ds); ok {
		return err
	}
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("DISK\tPATH\tSTATUS\tSIZE\tUSED\tFREE\tEXTENTS\tIDENTITY\n")
	var reasons []string
	for _, d := range ds {
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", short(d.UUID), dash(d.Path), d.Status,
			human(d.Size), human(d.Used), human(d.Free), d.Extents, dash(d.Identity))
		if d.Reason != "" {
			reasons = append(reasons, fmt.Sprintf("  %s: %s", dash(d.Path), d.Reason))
		}
	}
	if ew.err != nil {
		return ew.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ew = &errWriter{w: r.w}
	for _, s := range reasons {
		ew.printf("%s\n", s)
	}
	return ew.err
}

func (r renderer) volumes(vs []pool.VolumeInfo) error {
	if ok, err := r.structured(vs); ok {
		return err
	}
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("NAME\tSIZE\tHEALTH\tMEMBERS\tBAD BLOCKS\tREBUILD\tNBD\n")
	for _, v := range vs {
		rebuild := "-"
		if v.Sync != nil {
			rebuild = fmt.Sprintf("%s %.1f%%", v.Sync.Kind, v.Sync.Percent)
		}
		sock := nbdSocket(r.o.RunDir, v.Name)
		if _, err := os.Stat(sock); err != nil {
			sock = "-"
		}
		ew.printf("%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", v.Name, human(v.Size), v.Health, v.InSync, len(v.Members),
			blocks(v.BadBlocks, v.LostBlocks), rebuild, sock)
	}
	if ew.err != nil {
		return ew.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ew = &errWriter{w: r.w}
	for _, v := range vs {
		if v.Reason != "" {
			ew.printf("  %s: %s\n", v.Name, v.Reason)
		}
	}
	return ew.err
}

// blocks shows a volume's bad block count with the lost ones: "0", "12", "12 (3 lost)".
func blocks(bad, lost int64) string {
	if lost > 0 {
		return fmt.Sprintf("%d (%d lost)", bad, lost)
	}
	return strconv.FormatInt(bad, 10)
}

func (r renderer) members(v pool.VolumeInfo) error {
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("  %s\tROLE\tDISK\tPATH\tSTATE\tBAD BLOCKS\tTIMEOUTS\n", v.Name)
	for _, m := range v.Members {
		ew.printf("  \t%d\t%s\t%s\t%s\t%d\t%d\n", m.Role, short(m.DiskUUID), dash(m.DiskPath), m.State, m.BadBlocks, m.TimedOut)
	}
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}

func (r renderer) status(s pool.Status) error {
	if ok, err := r.structured(s); ok {
		return err
	}
	c := s.Capacity
	ew := &errWriter{w: r.w}
	ew.printf("Pool %s (%s)\n", s.Name, s.UUID)
	ew.printf("Capacity: raw %s, usable %s (mirrored), free %s, largest new volume %s, spares %s\n\n",
		human(c.Raw), human(c.Usable), human(c.FreeUsable), human(c.LargestVolume), human(c.Spare))
	if ew.err != nil {
		return ew.err
	}
	if err := r.disks(s.Disks); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(r.w); err != nil {
		return err
	}
	if err := r.volumes(s.Volumes); err != nil {
		return err
	}
	for _, v := range s.Volumes {
		if _, err := fmt.Fprintln(r.w); err != nil {
			return err
		}
		if err := r.members(v); err != nil {
			return err
		}
	}
	return nil
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

// progressBar draws a rebuild's progress: "[#####.....] 52% ETA 1m10s".
func progressBar(p *v1alpha1.RebuildProgress) string {
	if p == nil {
		return "-"
	}
	const width = 10
	pct := min(max(p.Percent, 0), 100)
	filled := int(pct) * width / 100
	eta := "-"
	if p.ETASeconds != nil {
		eta = (time.Duration(*p.ETASeconds) * time.Second).String()
	}
	return fmt.Sprintf("[%s%s] %d%% ETA %s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), pct, eta)
}

// structured writes v as JSON or YAML (-o), reporting whether it did.
func (r renderer) structured(v any) (bool, error) {
	switch r.o.Output {
	case "json":
		return true, r.json(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = r.w.Write(b)
		return true, err
	}
	return false, nil
}

func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func volumeSize(v *v1alpha1.Raid10Volume) string {
	if v.Status.Capacity != nil {
		return human(uint64(v.Status.Capacity.Value()))
	}
	return human(uint64(v.Spec.SizeBytes))
}

// clusterOverview is what status prints with -o json|yaml.
type clusterOverview struct {
	Nodes   []nodeSummary   `json:"nodes"`
	Volumes []volumeSummary `json:"volumes"`
}

type nodeSummary struct {
	Name         string `json:"name"`
	Disks        int32  `json:"disks"`
	HealthyDisks int32  `json:"healthyDisks"`
	UsableBytes  int64  `json:"usableBytes"`
	FreeBytes    int64  `json:"freeBytes"`
	Ready        string `json:"ready"`
}

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

func conditionStatus(conds []metav1.Condition, t string) string {
	for _, c := range conds {
		if c.Type == t {
			return string(c.Status)
		}
	}
	return "Unknown"
}

// clusterStatus prints the nodes (disks healthy/total, usable, free) and the volumes, the
// failed, degraded and rebuilding ones first.
func (r renderer) clusterStatus(nodes []v1alpha1.Raid10Node, vols []v1alpha1.Raid10Volume, now time.Time) error {
	slices.SortStableFunc(vols, func(a, b v1alpha1.Raid10Volume) int { return healthRank(a) - healthRank(b) })
	var ov clusterOverview
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
	if ov.Nodes == nil {
		ov.Nodes = []nodeSummary{}
	}
	if ov.Volumes == nil {
		ov.Volumes = []volumeSummary{}
	}
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
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew = &errWriter{w: tw}
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
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}

// clusterVolumes prints the volumes as `kubectl get r10v` does, with the rebuild as a bar.
func (r renderer) clusterVolumes(vols []v1alpha1.Raid10Volume, now time.Time) error {
	if ok, err := r.structured(listOf("Raid10VolumeList", vols)); ok {
		return err
	}
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("NAME\tNODE\tSIZE\tSTATE\tHEALTH\tMEMBERS\tBAD BLOCKS\tREBUILD\tCLAIM\tAGE\n")
	for i := range vols {
		v := &vols[i]
		claim := "-"
		if ns, name := v.Annotations[v1alpha1.PVCNamespaceAnnotation], v.Annotations[v1alpha1.PVCNameAnnotation]; name != "" {
			claim = ns + "/" + name
		}
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.Spec.Node, volumeSize(v), dash(string(v.Status.Phase)),
			dash(string(v.Status.Health)), dash(v.Status.InSync), blocks(v.Status.BadBlocks, v.Status.LostBlocks),
			progressBar(v.Status.Rebuild), claim, age(v.CreationTimestamp, now))
	}
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}

// listOf wraps items as a Kubernetes List, as kubectl get -o json prints them.
func listOf[T any](kind string, items []T) map[string]any {
	if items == nil {
		items = []T{}
	}
	return map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind, "items": items}
}

// clusterDisks prints every node's disks.
func (r renderer) clusterDisks(nodes []v1alpha1.Raid10Node) error {
	if ok, err := r.structured(listOf("Raid10NodeList", nodes)); ok {
		return err
	}
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew := &errWriter{w: tw}
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
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}
