package main

// Rendering of describe volume, in the manner of kubectl describe: the volume's spec and
// status, its source and snapshots, then tables of its members, conditions and Events.

import (
	"fmt"
	"strings"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// describedVolume is what describe volume prints with -o json|yaml.
type describedVolume struct {
	Volume    *v1alpha1.Raid10Volume    `json:"volume"`
	Snapshots []v1alpha1.Raid10Snapshot `json:"snapshots"`
	Events    []eventsv1.Event          `json:"events"`
}

// describe prints d as a table; paths are the disk paths of the volume's node by disk id.
func (r renderer) describe(d describedVolume, paths map[string]string, now time.Time) error {
	ew := &errWriter{w: r.w}
	describeSpec(ew, d.Volume, now)
	describeStatus(ew, d.Volume, now)
	volumeSnapshotsSection(ew, d.Volume, d.Snapshots, now)
	if ew.err != nil {
		return ew.err
	}
	tw, ew := r.table()
	describeMembers(ew, d.Volume.Status.Members, paths)
	describeConditions(ew, d.Volume.Status.Conditions, now)
	describeEvents(ew, d.Events, now)
	return flush(tw, ew)
}

// describeSpec prints the volume's names, age and spec.
func describeSpec(ew *errWriter, v *v1alpha1.Raid10Volume, now time.Time) {
	ew.printf("Name:          %s\n", v.Name)
	ew.printf("Node:          %s\n", v.Spec.Node)
	if n := v.Annotations[v1alpha1.PVCNameAnnotation]; n != "" {
		ew.printf("Claim:         %s/%s\n", v.Annotations[v1alpha1.PVCNamespaceAnnotation], n)
	}
	if n := v.Annotations[v1alpha1.PVNameAnnotation]; n != "" {
		ew.printf("Volume:        %s\n", n)
	}
	ew.printf("Age:           %s\n", age(v.CreationTimestamp, now))
	if v.DeletionTimestamp != nil {
		ew.printf("Deleting:      since %s ago\n", age(*v.DeletionTimestamp, now))
	}
	ew.printf("Spec:\n")
	ew.printf("  Size:        %s (%d bytes)\n", human(uint64(v.Spec.SizeBytes)), v.Spec.SizeBytes)
	ew.printf("  Layout:      %d members, %s chunks (near-2)\n", v.Spec.Layout.Members, human(uint64(v.Spec.Layout.ChunkSizeBytes)))
	ew.printf("  Volume mode: %s\n", v.Spec.VolumeMode)
	ew.printf("  FS type:     %s\n", dash(string(v.Spec.FSType)))
	ew.printf("  Encryption:  %s\n", encryptionOf(v))
	describeLimitsSpec(ew, v)
}

// describeStatus prints the volume's status: phase, health, capacity, bad blocks, the
// rebuild and the scrub.
func describeStatus(ew *errWriter, v *v1alpha1.Raid10Volume, now time.Time) {
	st := v.Status
	ew.printf("Status:\n")
	ew.printf("  Phase:       %s\n", dash(string(st.Phase)))
	ew.printf("  Health:      %s\n", dash(string(st.Health)))
	capacity := "-"
	if st.Capacity != nil {
		capacity = fmt.Sprintf("%s (%d bytes)", human(uint64(st.Capacity.Value())), st.Capacity.Value())
	}
	ew.printf("  Capacity:    %s\n", capacity)
	ew.printf("  In sync:     %s\n", dash(st.InSync))
	ew.printf("  Bad blocks:  %d", st.BadBlocks)
	if st.LostBlocks > 0 {
		ew.printf(", %d lost (bad on every copy: reads there fail until rewritten)", st.LostBlocks)
	}
	ew.printf("\n")
	ew.printf("  Device:      %s\n", dash(st.DevicePath))
	describeLimitsStatus(ew, v)
	if p := st.Rebuild; p != nil {
		ew.printf("  Rebuild:     %s\n", rebuildDetail(p, now))
	}
	if sc := st.Scrub; sc != nil {
		ew.printf("  Scrub:       %s", strings.TrimPrefix(clusterScrubLine(v.Name, sc), v.Name+": "))
		if sc.LastCompletedTime != nil {
			ew.printf(", last completed %s ago", age(*sc.LastCompletedTime, now))
		}
		ew.printf("\n")
	}
	ew.printf("  Message:     %s\n", dash(st.Message))
	ew.printf("  Observed:    generation %d of %d\n", st.ObservedGeneration, v.Generation)
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
			ew.printf("Copy:          %s\n", hydrationDetail(h))
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

// describeMembers prints the Members table, with each member's disk path on its node.
func describeMembers(ew *errWriter, members []v1alpha1.MemberStatus, paths map[string]string) {
	ew.printf("Members:\n")
	if len(members) == 0 {
		ew.printf("  (none reported)\n")
	} else {
		ew.printf("  INDEX\tDISK\tPATH\tSTATE\tBAD BLOCKS\tTIMEOUTS\tMESSAGE\n")
	}
	for _, m := range members {
		ew.printf("  %d\t%s\t%s\t%s\t%d\t%d\t%s\n", m.Index, dash(m.Disk), dash(paths[m.Disk]), m.State, m.BadBlocks, m.Timeouts, dash(m.Message))
	}
}

// describeConditions prints the Conditions table.
func describeConditions(ew *errWriter, conds []metav1.Condition, now time.Time) {
	ew.printf("Conditions:\n")
	if len(conds) == 0 {
		ew.printf("  (none)\n")
	} else {
		ew.printf("  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE\n")
	}
	for _, cd := range conds {
		ew.printf("  %s\t%s\t%s\t%s\t%s\n", cd.Type, cd.Status, cd.Reason, age(cd.LastTransitionTime, now), dash(cd.Message))
	}
}

// describeEvents prints the Events table, oldest first.
func describeEvents(ew *errWriter, evs []eventsv1.Event, now time.Time) {
	ew.printf("Events:\n")
	if len(evs) == 0 {
		ew.printf("  (none)\n")
	} else {
		ew.printf("  TYPE\tREASON\tAGE\tFROM\tMESSAGE\n")
	}
	for _, e := range evs {
		from := e.ReportingController
		if from == "" {
			from = e.DeprecatedSource.Component
		}
		ew.printf("  %s\t%s\t%s\t%s\t%s\n", e.Type, e.Reason, age(metav1.NewTime(eventTime(e)), now), dash(from), e.Note)
	}
}

// encryptionOf says whether the volume is encrypted at rest, as its StorageClass asked
// (the annotation the controller writes at creation).
func encryptionOf(v *v1alpha1.Raid10Volume) string {
	if encrypted(v) {
		return "LUKS2 (dm-crypt on the node; key from the node-stage Secret)"
	}
	return "none"
}
