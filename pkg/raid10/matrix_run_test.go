package raid10

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The fault matrix's driver (see TestFaultMatrix): the rounds of a run and
// their totals.

type matrixTotals struct {
	stepsPer      int // fault steps per round
	mu            sync.Mutex
	rounds        int
	steps         int
	ops           int64
	faults        map[string]map[string]int // kind -> phase -> count
	eioRead       int64                     // blocks that failed a read during the rounds
	eioEnd        int64                     // blocks that read as EIO after reassembly
	lostRep       int64                     // lost blocks the engine reported at the end
	wrong         int64                     // must stay 0
	timeouts      uint64
	crashBroken   int   // crash rounds with a member broken at the crash
	restarts      int   // restarts with a fault kept that assembled
	discardsAfter int64 // blocks that held what a discard left after a crash
	queue         queueCounts
}

func (m *matrixTotals) fault(kind, phase string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.faults[kind] == nil {
		m.faults[kind] = map[string]int{}
	}
	m.faults[kind][phase]++
}

// runMatrix runs the fault matrix's rounds with cfg: seeds fixed rounds
// (seeds drawn with add) of fixedSteps steps, or the soak's or a replay's.
func runMatrix(t *testing.T, seeds int, add uint64, fixedSteps int, cfg matrixCfg) {
	// The fixed set runs shorter rounds (make test's time); the soak and
	// replays 30 steps unless RAID10_STEPS says otherwise.
	tot := &matrixTotals{faults: map[string]map[string]int{}, stepsPer: 30}
	if os.Getenv("RAID10_SEED") == "" && os.Getenv("RAID10_SOAK") == "" {
		tot.stepsPer = fixedSteps
	}
	if v := os.Getenv("RAID10_STEPS"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 {
			t.Fatalf("RAID10_STEPS=%q: want a positive number of steps", v)
		}
		tot.stepsPer = k
	}
	runSeeds(t, seeds, add, func(t *testing.T, s uint64) { matrixRound(t, s, tot, cfg) })
	var b strings.Builder
	kinds := make([]string, 0, len(tot.faults))
	for k := range tot.faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "\n  %-18s", k)
		phases := make([]string, 0)
		for p := range tot.faults[k] {
			phases = append(phases, p)
		}
		sort.Strings(phases)
		for _, p := range phases {
			fmt.Fprintf(&b, " %s=%d", p, tot.faults[k][p])
		}
	}
	t.Logf("fault matrix: %d rounds, %d steps, %d I/O ops, %d member timeouts; EIO blocks during rounds %d, after reassembly %d (engine reported %d lost); wrong data %d; crashes with a member broken %d; blocks holding a discard's leftover after a crash %d; restarts with a fault kept that assembled %d\nfaults by kind and phase:%s",
		tot.rounds, tot.steps, tot.ops, tot.timeouts, tot.eioRead, tot.eioEnd, tot.lostRep, tot.wrong, tot.crashBroken, tot.discardsAfter, tot.restarts, b.String())
	if cfg.queueShare > 0 {
		c := &tot.queue
		t.Logf("Queue (share %.2f): %d requests on the ring, %d fell back to the synchronous path; ring I/O meeting an injected failure %d, a hang %d; %d ring copies abandoned; %d requests in flight at a crash",
			cfg.queueShare, c.fast.Load(), c.fallback.Load(), c.failing.Load(), c.hung.Load(), c.abandoned.Load(), c.crashInflight.Load())
		if c.fast.Load() == 0 || c.fallback.Load() == 0 {
			t.Errorf("ring %d, fallback %d: both paths must run", c.fast.Load(), c.fallback.Load())
		}
	}
	if tot.wrong != 0 {
		t.Fatalf("%d reads returned wrong data", tot.wrong)
	}
}

// arrayBlockOf maps member d's member block mb to the array block it holds
// a copy of (-1 outside the data).
func arrayBlockOf(g *geometry, d int, mb int64) int64 {
	rel := mb - g.dataOffset/BlockSize
	per := g.chunk / BlockSize
	if rel < 0 {
		return -1
	}
	row, within := rel/per, rel%per
	c := (row*int64(g.n) + int64(d)) / 2
	return c*per + within
}
