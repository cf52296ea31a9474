package driver

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// Reasons of the VolumeHealth entries (CSI 1.13: a CamelCase reason per status). Both sides
// give the same reasons for the same facts: the node service reads the pool, the controller
// the Raid10Volume status the node agent wrote from it (crstatus.VolumeStatus does both).
const (
	// HealthReasonVolumeFailed (INACCESSIBLE): some chunk has no copy, the array did not
	// assemble, or its copy from a source failed; I/O fails.
	HealthReasonVolumeFailed = "VolumeFailed"
	// HealthReasonMemberDown (DEGRADED): a member is failed or missing and nothing rebuilds
	// it; the message names each member and its disk.
	HealthReasonMemberDown = "MemberDown"
	// HealthReasonRebuilding (DEGRADED): a member is being rebuilt from its mirror; until it
	// ends its chunks have one copy. The message has the progress and the ETA.
	HealthReasonRebuilding = "Rebuilding"
	// HealthReasonBadBlocks (DEGRADED): blocks recorded bad (on one copy: read from the other;
	// on every copy: LostBlocks too).
	HealthReasonBadBlocks = "BadBlocks"
	// HealthReasonLostBlocks (DATA_LOSS): blocks bad on every copy; reads there fail with an
	// I/O error until they are written again.
	HealthReasonLostBlocks = "LostBlocks"
	// HealthReasonScrubMismatches (DEGRADED): the last scrub found blocks whose two copies
	// differ and did not repair them all.
	HealthReasonScrubMismatches = "ScrubMismatches"
	// HealthReasonScrubLost (DATA_LOSS): the last scrub found blocks with no readable copy.
	HealthReasonScrubLost = "ScrubLostBlocks"
	// HealthReasonCopying (DEGRADED): a restored or cloned volume is still being copied from
	// its source; the blocks not yet copied are read from the source, which must stay.
	HealthReasonCopying = "CopyInProgress"
)

// volumeHealth is the CSI VolumeHealth of the volume id whose state st says (a
// Raid10Volume's status, or the one crstatus.VolumeStatus makes from the pool on the node).
// diskName names a member's disk by its ID (status.members[].disk); an empty list of
// entries means healthy. Each (status, reason) appears at most once, as the spec asks.
func volumeHealth(id string, st *v1alpha1.Raid10VolumeStatus, diskName func(string) string) *csi.VolumeHealth {
	vh := &csi.VolumeHealth{VolumeId: id}
	add := func(s csi.VolumeHealthErrorType, reason, msg string) {
		vh.HealthStatuses = append(vh.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: s, Reason: reason, Message: capMessage(msg)})
	}
	if st.Phase == v1alpha1.VolumePhaseFailed || st.Health == v1alpha1.VolumeHealthFailed {
		add(csi.VolumeHealthErrorType_INACCESSIBLE, HealthReasonVolumeFailed, failedMessage(st))
	}
	if m := membersDown(st, diskName); m != "" {
		add(csi.VolumeHealthErrorType_DEGRADED, HealthReasonMemberDown, m)
	}
	if st.Health == v1alpha1.VolumeHealthRebuilding {
		add(csi.VolumeHealthErrorType_DEGRADED, HealthReasonRebuilding, rebuildMessage(st, diskName))
	}
	if st.BadBlocks > 0 {
		add(csi.VolumeHealthErrorType_DEGRADED, HealthReasonBadBlocks, badBlocksMessage(st))
	}
	if st.LostBlocks > 0 {
		add(csi.VolumeHealthErrorType_DATA_LOSS, HealthReasonLostBlocks, fmt.Sprintf(
			"%d blocks bad on every copy: reads there fail with I/O errors until they are written again", st.LostBlocks))
	}
	if sc := st.Scrub; sc != nil {
		if sc.Mismatches > sc.Repaired {
			add(csi.VolumeHealthErrorType_DEGRADED, HealthReasonScrubMismatches, fmt.Sprintf(
				"the last scrub (%s, %s) found %d blocks whose copies differ, %d repaired: a repair scrub rewrites them",
				sc.Kind, sc.State, sc.Mismatches, sc.Repaired))
		}
		if sc.Lost > 0 {
			add(csi.VolumeHealthErrorType_DATA_LOSS, HealthReasonScrubLost, fmt.Sprintf(
				"the last scrub (%s, %s) found %d blocks with no readable copy", sc.Kind, sc.State, sc.Lost))
		}
	}
	if h := st.Hydration; h != nil && !h.Hydrated && st.Phase != v1alpha1.VolumePhaseFailed {
		add(csi.VolumeHealthErrorType_DEGRADED, HealthReasonCopying, fmt.Sprintf(
			"being copied from its source: %d%% (%d of %d bytes); blocks not yet copied are read from the source",
			h.Percent, h.CopiedBytes, h.TotalBytes))
	}
	return vh
}

// failedMessage says why a volume is Failed: the agent's message, else its Ready condition's.
func failedMessage(st *v1alpha1.Raid10VolumeStatus) string {
	msg := fmt.Sprintf("volume is Failed (%s members in sync)", orUnknown(st.InSync))
	switch {
	case st.Message != "":
		msg += ": " + st.Message
	default:
		for _, c := range st.Conditions {
			if c.Type == v1alpha1.ConditionReady && c.Message != "" {
				msg += ": " + c.Message
			}
		}
	}
	return msg
}

// membersDown lists the failed and missing members with their disks; "" when none is, or
// when all are.
func membersDown(st *v1alpha1.Raid10VolumeStatus, diskName func(string) string) string {
	var down []string
	for _, m := range st.Members {
		if m.State != v1alpha1.MemberStateFailed && m.State != v1alpha1.MemberStateMissing {
			continue
		}
		d := fmt.Sprintf("member %d %s", m.Index, m.State)
		if m.Disk != "" {
			d += " on disk " + diskName(m.Disk)
		}
		if m.Message != "" {
			d += " (" + m.Message + ")"
		}
		down = append(down, d)
	}
	if len(down) == 0 || len(down) == len(st.Members) {
		return "" // none, or the array is not assembled: VolumeFailed says why
	}
	msg := strings.Join(down, ", ") + "; " + orUnknown(st.InSync) + " members in sync"
	if st.Health == v1alpha1.VolumeHealthDegraded {
		msg += ", nothing rebuilds it yet: replace the disk or add a hot spare"
	}
	return msg
}

// rebuildMessage says which member rebuilds onto which disk, how far, how fast and the ETA.
func rebuildMessage(st *v1alpha1.Raid10VolumeStatus, diskName func(string) string) string {
	r := st.Rebuild
	if r == nil {
		return "a member is being rebuilt from its mirror; redundancy reduced until it ends, " + orUnknown(st.InSync) + " members in sync"
	}
	msg := fmt.Sprintf("member %d", r.Member)
	for _, m := range st.Members {
		if m.Index == r.Member && m.Disk != "" {
			msg += " on disk " + diskName(m.Disk)
		}
	}
	msg += fmt.Sprintf(" is being rebuilt from its mirror: %d%% (%d of %d bytes", r.Percent, r.DoneBytes, r.TotalBytes)
	if r.BytesPerSecond > 0 {
		msg += fmt.Sprintf(", %d bytes/s", r.BytesPerSecond)
	}
	if r.ETASeconds != nil {
		msg += ", ETA " + (time.Duration(*r.ETASeconds) * time.Second).String()
	}
	return msg + "); redundancy reduced until it ends, " + orUnknown(st.InSync) + " members in sync"
}

// badBlocksMessage counts the bad blocks, per member.
func badBlocksMessage(st *v1alpha1.Raid10VolumeStatus) string {
	var per []string
	for _, m := range st.Members {
		if m.BadBlocks > 0 {
			per = append(per, fmt.Sprintf("member %d: %d", m.Index, m.BadBlocks))
		}
	}
	msg := fmt.Sprintf("%d blocks recorded bad, summed over the members", st.BadBlocks)
	if len(per) > 0 {
		msg += " (" + strings.Join(per, ", ") + ")"
	}
	return msg + ": a block bad on one copy is read from the other"
}

// MaxHealthMessage is the longest message of a health entry, in bytes: the kubelet copies
// the messages as they are into the pod's status.volumeHealth and the CSINode's
// status.storageHealth, whose API validation refuses one longer than 1024 bytes (and with
// it the kubelet's whole status update).
const MaxHealthMessage = 1024

// capMessage cuts msg to MaxHealthMessage bytes, at a rune boundary, ending in "...".
func capMessage(msg string) string {
	if len(msg) <= MaxHealthMessage {
		return msg
	}
	const more = "..."
	cut := MaxHealthMessage - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

// abnormal reports whether vh has any entry.
func abnormal(vh *csi.VolumeHealth) bool { return len(vh.GetHealthStatuses()) > 0 }
