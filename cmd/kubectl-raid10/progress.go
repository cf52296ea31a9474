package main

// Progress: how far a long operation has come (a rebuild or resync, a scrub, the copy of a
// snapshot or a clone). Each status reports it in its own type (package pool in local mode,
// the custom resources in cluster mode); the functions here are the only ones that turn it
// into text, so that a bar and a "done of total, rate, ETA" read the same in every command.

import (
	"fmt"
	"strings"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// barWidth is the number of cells of a progress bar.
const barWidth = 10

// bar draws a percentage, clamped to 0-100, as ten cells: "[#####.....] 52%".
func bar(pct int) string {
	pct = min(max(pct, 0), 100)
	filled := pct * barWidth / 100
	return fmt.Sprintf("[%s%s] %d%%", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), pct)
}

// progressBar draws a rebuild's progress with its time left: "[#####.....] 52% ETA 1m10s"
// ("ETA -" before the agent has measured a rate; "-" for no rebuild).
func progressBar(p *v1alpha1.RebuildProgress) string {
	if p == nil {
		return "-"
	}
	eta := "-"
	if p.ETASeconds != nil {
		eta = (time.Duration(*p.ETASeconds) * time.Second).String()
	}
	return bar(int(p.Percent)) + " ETA " + eta
}

// copyBar draws the copy of a snapshot or a clone: "[####......] 47%", or "ready".
func copyBar(ready bool, pct int32) string {
	if ready {
		return "ready"
	}
	return bar(int(pct))
}

// snapshotCopyBar is copyBar for a pool snapshot (local mode), which reports bytes: an
// unfinished copy shows at most 99%.
func snapshotCopyBar(s pool.SnapshotInfo) string {
	pct := int32(100)
	if s.Size > 0 && !s.Ready {
		pct = int32(min(99, s.Copied*100/s.Size))
	}
	return copyBar(s.Ready, pct)
}

// span is how much of how much: "33MiB of 64MiB", then ", 4MiB/s" and ", ETA 1m10s" where
// the caller shows the rate and the time left.
type span struct {
	done, total uint64
	// rate in bytes per second, shown when withRate.
	rate     uint64
	withRate bool
	// eta, shown when withETA.
	eta     time.Duration
	withETA bool
}

func (s span) String() string {
	text := fmt.Sprintf("%s of %s", human(s.done), human(s.total))
	if s.withRate {
		text += fmt.Sprintf(", %s/s", human(s.rate))
	}
	if s.withETA {
		text += fmt.Sprintf(", ETA %s", s.eta)
	}
	return text
}

// syncColumn is the REBUILD column of a local volume: "recovery 52.3%", or "-".
func syncColumn(p *pool.Progress) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%s %.1f%%", p.Kind, p.Percent)
}

// syncLine is wait's line of a local volume: "v1: Degraded, 3/4 members in sync, recovery
// 52.3% (33MiB of 64MiB, 4MiB/s, ETA 8s)".
func syncLine(v *pool.VolumeInfo) string {
	line := fmt.Sprintf("%s: %s, %d/%d members in sync", v.Name, v.Health, v.InSync, len(v.Members))
	if p := v.Sync; p != nil {
		s := span{done: uint64(p.Done), total: uint64(p.Total), rate: uint64(p.Rate), withRate: true,
			eta: p.ETA.Round(time.Second), withETA: true}
		line += fmt.Sprintf(", %s %5.1f%% (%s)", p.Kind, p.Percent, s)
	}
	return line
}

// rebuildLine is replace-disk --follow's line of a volume: "pvc-1: Rebuilding [#####.....]
// 52% ETA 1m10s", or "pvc-1: Healthy, 4/4 members in sync".
func rebuildLine(v *v1alpha1.Raid10Volume) string {
	if v.Status.Health == v1alpha1.VolumeHealthHealthy {
		return fmt.Sprintf("%s: Healthy, %s members in sync", v.Name, v.Status.InSync)
	}
	return fmt.Sprintf("%s: %s %s", v.Name, dash(string(v.Status.Health)), progressBar(v.Status.Rebuild))
}

// rebuildDetail is describe's Rebuild line: "member 2 [#####.....] 52% ETA 1m10s (33MiB of
// 64MiB, 4MiB/s, started 30s ago)".
func rebuildDetail(p *v1alpha1.RebuildProgress, now time.Time) string {
	s := span{done: uint64(p.DoneBytes), total: uint64(p.TotalBytes), rate: uint64(p.BytesPerSecond), withRate: true}
	line := fmt.Sprintf("member %d %s (%s", p.Member, progressBar(p), s)
	if p.StartTime != nil {
		line += fmt.Sprintf(", started %s ago", age(*p.StartTime, now))
	}
	return line + ")"
}

// hydrationDetail is describe's Copy line of a clone or restore: "[#.........] 15% 10MiB of
// 64MiB, copying from the source".
func hydrationDetail(h *v1alpha1.HydrationStatus) string {
	state := "copying from the source"
	if h.Hydrated {
		state = "hydrated: independent of the source"
	}
	return fmt.Sprintf("%s %s, %s", copyBar(false, h.Percent), span{done: uint64(h.CopiedBytes), total: uint64(h.TotalBytes)}, state)
}

// scrubLine is one line of a local scrub: "v1: check Running  40.0% (20MiB of 64MiB, 1MiB/s,
// ETA 44s), 0 mismatches".
func scrubLine(name string, sc pool.ScrubInfo) string {
	s := span{done: uint64(sc.Done), total: uint64(sc.Total)}
	if sc.State == pool.ScrubRunning && sc.Rate > 0 {
		s.rate, s.withRate = uint64(sc.Rate), true
		s.eta, s.withETA = sc.ETA.Round(time.Second), true
	}
	line := fmt.Sprintf("%s: %s %s %5.1f%% (%s)", name, sc.Kind, sc.State, sc.Percent, s)
	return line + scrubCounts(sc.Kind == pool.ScrubRepair, sc.Mismatches, sc.Repaired, sc.Lost, sc.Error)
}

// clusterScrubLine is one line of a volume's status.scrub: "pvc-1: check Running 40%
// (20MiB of 64MiB, 1MiB/s, ETA 44s), 0 mismatches".
func clusterScrubLine(name string, sc *v1alpha1.ScrubStatus) string {
	s := span{done: uint64(sc.DoneBytes), total: uint64(sc.TotalBytes)}
	if sc.State == v1alpha1.ScrubStateRunning && sc.BytesPerSecond > 0 {
		s.rate, s.withRate = uint64(sc.BytesPerSecond), true
		if sc.ETASeconds != nil {
			s.eta, s.withETA = time.Duration(*sc.ETASeconds)*time.Second, true
		}
	}
	line := fmt.Sprintf("%s: %s %s %d%% (%s)", name, sc.Kind, sc.State, sc.Percent, s)
	return line + scrubCounts(sc.Kind == v1alpha1.ScrubKindRepair, sc.Mismatches, sc.Repaired, sc.Lost, sc.Message)
}

// scrubCounts ends a scrub's line: ", 2 mismatches, 2 repaired, 1 lost: message" (repaired
// for a repair, lost when there are any).
func scrubCounts(repair bool, mismatches, repaired, lost int64, msg string) string {
	text := fmt.Sprintf(", %d mismatches", mismatches)
	if repair {
		text += fmt.Sprintf(", %d repaired", repaired)
	}
	if lost > 0 {
		text += fmt.Sprintf(", %d lost", lost)
	}
	if msg != "" {
		text += ": " + msg
	}
	return text
}
