package attach

import (
	"fmt"
	"strings"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// VolumeState is what the CSI node service needs to know of a volume.
type VolumeState struct {
	// SizeBytes is the volume's usable size.
	SizeBytes int64
	// Abnormal is true while the volume is Degraded, Rebuilding (redundancy reduced until
	// the rebuild ends) or Failed, or has lost blocks (bad on every copy); Message says why,
	// with a rebuild's progress, and counts bad and lost blocks.
	Abnormal bool
	Message  string
}

// volumeState is the node service's view of a pool volume. It is abnormal whenever the
// volume has less redundancy than its layout promises or lost data: Degraded (a member down,
// or blocks recorded bad), Rebuilding (a member is being filled from its mirror: until it
// is done one copy of its chunks exists, so the progress is in the message) and Failed; and
// whenever blocks are lost (bad on every copy: reads there fail with EIO). Healthy is normal,
// also during a resync after an unclean stop or a scrub (both copies are there). The
// message says why and counts the bad and lost blocks.
func volumeState(vi pool.VolumeInfo) VolumeState {
	vs := VolumeState{SizeBytes: int64(vi.Size)}
	var notes []string
	switch vi.Health {
	case pool.Degraded, pool.Failed:
		vs.Abnormal = true
		notes = append(notes, fmt.Sprintf("volume is %s: %d of %d members in sync", vi.Health, vi.InSync, len(vi.Members)))
	case pool.Rebuilding:
		vs.Abnormal = true
		n := fmt.Sprintf("volume is Rebuilding, redundancy reduced: %d of %d members in sync", vi.InSync, len(vi.Members))
		if p := vi.Sync; p != nil {
			n += ", " + progressMessage(p)
		}
		notes = append(notes, n)
	}
	if vi.LostBlocks > 0 {
		vs.Abnormal = true
	}
	if b := BlocksMessage(vi.BadBlocks, vi.LostBlocks); b != "" {
		notes = append(notes, b)
	}
	if vi.Reason != "" && vs.Abnormal {
		notes = append(notes, vi.Reason)
	}
	vs.Message = strings.Join(notes, "; ")
	return vs
}

// progressMessage says how far a rebuild (or resync, scrub) is: "recovery 42% (..., ETA 1m3s)".
func progressMessage(p *pool.Progress) string {
	m := fmt.Sprintf("%s %d%% (%d of %d bytes", p.Kind, int(p.Percent), p.Done, p.Total)
	if p.Rate > 0 {
		m += fmt.Sprintf(", %d bytes/s", int64(p.Rate))
	}
	if p.ETA > 0 {
		m += ", ETA " + p.ETA.Round(time.Second).String()
	}
	return m + ")"
}

// BlocksMessage counts a volume's bad and lost blocks for a VolumeCondition; empty when
// there are none.
func BlocksMessage(bad, lost int64) string {
	switch {
	case lost > 0:
		return fmt.Sprintf("%d blocks lost (bad on every copy: reads there fail with I/O errors until rewritten), %d bad blocks in all", lost, bad)
	case bad > 0:
		return fmt.Sprintf("%d bad blocks (each still read from its other copy)", bad)
	}
	return ""
}
