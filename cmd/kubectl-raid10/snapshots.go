package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// copyBar draws a copy's progress: "[#####.....] 50%", or "ready".
func copyBar(ready bool, pct int32) string {
	if ready {
		return "ready"
	}
	n := int(pct) / 10
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", 10-n) + fmt.Sprintf("] %d%%", pct)
}

// listSnapshots reads every Raid10Snapshot (of volume source, when not empty), by name.
func listSnapshots(ctx context.Context, c client.Client, source string) ([]v1alpha1.Raid10Snapshot, error) {
	var l v1alpha1.Raid10SnapshotList
	if err := c.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list Raid10Snapshots: %w", err)
	}
	var out []v1alpha1.Raid10Snapshot
	for _, s := range l.Items {
		if source == "" || s.Spec.Source == source {
			out = append(out, s)
		}
	}
	return out, nil
}

// clusterSnapshots prints the snapshots with their copy progress, as `kubectl get r10s`.
func (r renderer) clusterSnapshots(snaps []v1alpha1.Raid10Snapshot, now time.Time) error {
	if ok, err := r.structured(listOf("Raid10SnapshotList", snaps)); ok {
		return err
	}
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("NAME\tSOURCE\tNODE\tSTATE\tCOPY\tSIZE\tCUT\tVOLUMESNAPSHOT\tAGE\n")
	for i := range snaps {
		s := &snaps[i]
		vs := "-"
		if ns, name := s.Annotations[v1alpha1.VolumeSnapshotNamespaceAnnotation], s.Annotations[v1alpha1.VolumeSnapshotNameAnnotation]; name != "" {
			vs = ns + "/" + name
		}
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
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}

// volumeSnapshotsSection prints describe volume's Source, Copy and Snapshots lines.
func volumeSnapshotsSection(ew *errWriter, v *v1alpha1.Raid10Volume, snaps []v1alpha1.Raid10Snapshot, now time.Time) {
	if s := v.Spec.Source; s != nil {
		if s.Snapshot != "" {
			ew.printf("Source:        snapshot %s (a restore)\n", s.Snapshot)
		} else {
			ew.printf("Source:        volume %s (a clone)\n", s.Volume)
		}
		if h := v.Status.Hydration; h != nil {
			state := "copying from the source"
			if h.Hydrated {
				state = "hydrated: independent of the source"
			}
			ew.printf("Copy:          %s %s of %s, %s\n", copyBar(false, h.Percent), human(uint64(h.CopiedBytes)), human(uint64(h.TotalBytes)), state)
		}
	}
	ew.printf("Snapshots:     ")
	if len(snaps) == 0 {
		ew.printf("(none)\n")
		return
	}
	ew.printf("%d\n", len(snaps))
	for i := range snaps {
		s := &snaps[i]
		cut := "not cut yet"
		if s.Status.CutAt != nil {
			cut = "cut " + age(*s.Status.CutAt, now) + " ago"
		}
		ew.printf("  %s\t%s, %s, %s\n", s.Name, dash(string(s.Status.Phase)), copyBar(s.Status.ReadyToUse, s.Status.Percent), cut)
	}
}

// localSnapshots prints the pool's snapshots (local mode), of volume source when not empty.
func (r renderer) localSnapshots(all []pool.SnapshotInfo, source string) error {
	var snaps []pool.SnapshotInfo
	for _, s := range all {
		if source == "" || s.Source == source {
			snaps = append(snaps, s)
		}
	}
	if snaps == nil {
		snaps = []pool.SnapshotInfo{}
	}
	if ok, err := r.structured(snaps); ok {
		return err
	}
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("NAME\tSOURCE\tSIZE\tCOPY\tCOPIED\tHEALTH\tMEMBERS\tCUT\n")
	now := time.Now()
	for _, s := range snaps {
		pct := int32(100)
		if s.Size > 0 && !s.Ready {
			pct = int32(min(99, s.Copied*100/s.Size))
		}
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s ago\n", s.Name, s.Source, human(s.Size), copyBar(s.Ready, pct), human(s.Copied),
			s.Health, s.Members, age(metav1.NewTime(s.CutAt), now))
	}
	if len(snaps) == 0 {
		ew.printf("(no snapshot)\n")
	}
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}
