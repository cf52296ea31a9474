package sanity

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
)

// suiteReport is the csi-sanity run's Ginkgo report, kept by the ReportAfterSuite below (a
// node of the same global suite that csisanity.Test runs).
var (
	suiteMu     sync.Mutex
	suiteReport *types.Report
)

var _ = ginkgo.ReportAfterSuite("raid10-csi: keep the report", func(r ginkgo.Report) {
	suiteMu.Lock()
	defer suiteMu.Unlock()
	suiteReport = &r
})

// The csi-sanity specs (csi-test v5.6.0) of snapshots and clones. Snapshot specs: every spec
// under the ListSnapshots, DeleteSnapshot and CreateSnapshot containers, and the two
// CreateVolume specs with a snapshot source; cloning: the two with a volume source.
const (
	wantSnapshotSpecs = 18
	wantCloningSpecs  = 2
)

// snapshotSkipsAllowed are the snapshot specs that skip by design. CSI 1.13's
// SNAPSHOT_ACCESSIBILITY_CONSTRAINTS (alpha) is not advertised: a snapshot lives on its
// source's node, which CreateVolume already enforces from the source (ErrTopology).
var snapshotSkipsAllowed = []string{"should succeed when creating a snapshot with accessibility requirements"}

var (
	snapshotContainers = []string{"ListSnapshots [Controller Server]", "DeleteSnapshot [Controller Server]", "CreateSnapshot [Controller Server]"}
	snapshotLeaves     = []string{"should create volume from an existing source snapshot", "should fail when the volume source snapshot is not found"}
	cloningLeaves      = []string{"should create volume from an existing source volume", "should fail when the volume source volume is not found"}
)

// checkSnapshotSpecs fails t unless the last csi-sanity run ran every snapshot and cloning
// spec and each passed (none skipped but snapshotSkipsAllowed: a capability the plugin stops
// advertising makes them skip), and logs the counts of the whole run. The specs under the
// containers in elsewhere run in the other pass (TestSanityVM's skip): this run must not
// have run them, and they count towards the snapshot specs.
func checkSnapshotSpecs(t *testing.T, elsewhere []string) {
	t.Helper()
	suiteMu.Lock()
	r := suiteReport
	suiteMu.Unlock()
	if r == nil {
		t.Fatal("csi-sanity left no Ginkgo report")
	}
	var snap, clone, passed, skipped, pending, failed, total, leftOut int
	var bad []string
	for _, s := range r.SpecReports {
		if s.LeafNodeType != types.NodeTypeIt {
			continue
		}
		total++
		switch s.State {
		case types.SpecStatePassed:
			passed++
		case types.SpecStateSkipped:
			skipped++
		case types.SpecStatePending:
			pending++
		default:
			failed++
		}
		isSnap, away := slices.Contains(snapshotLeaves, s.LeafNodeText), false
		for _, c := range s.ContainerHierarchyTexts {
			isSnap = isSnap || slices.Contains(snapshotContainers, c)
			away = away || slices.Contains(elsewhere, c)
		}
		if away {
			if s.State != types.SpecStateSkipped {
				bad = append(bad, s.State.String()+" (want it left to the other pass): "+strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " "))
			}
			if isSnap {
				snap++
				leftOut++
			}
			continue
		}
		isClone := slices.Contains(cloningLeaves, s.LeafNodeText)
		if !isSnap && !isClone {
			continue
		}
		if isSnap {
			snap++
		} else {
			clone++
		}
		if s.State == types.SpecStateSkipped && slices.Contains(snapshotSkipsAllowed, s.LeafNodeText) {
			continue
		}
		if s.State != types.SpecStatePassed {
			bad = append(bad, s.State.String()+": "+strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " "))
		}
	}
	t.Logf("csi-sanity: %d specs, %d passed, %d skipped, %d pending, %d failed; snapshot specs %d (want %d; %d of them left to the other pass), cloning specs %d (want %d), not passed among them: %d",
		total, passed, skipped, pending, failed, snap, wantSnapshotSpecs, leftOut, clone, wantCloningSpecs, len(bad))
	if snap != wantSnapshotSpecs || clone != wantCloningSpecs || len(bad) > 0 {
		t.Errorf("snapshot specs %d (want %d), cloning specs %d (want %d); not passed: %v", snap, wantSnapshotSpecs, clone, wantCloningSpecs, bad)
	}
}
