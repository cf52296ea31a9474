package agent_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// blockPool is a real pool whose volumes report the bad and lost block counts set on it, as
// the engine reports them in raid10.Status (member 0 holds the bad blocks), with the health
// the pool gives such a volume: never Healthy.
type blockPool struct {
	*pool.Pool
	mu        sync.Mutex
	bad, lost int64
}

func (p *blockPool) set(bad, lost int64) {
	p.mu.Lock()
	p.bad, p.lost = bad, lost
	p.mu.Unlock()
}

func (p *blockPool) withBlocks(vi pool.VolumeInfo) pool.VolumeInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	vi.BadBlocks, vi.LostBlocks = p.bad, p.lost
	if len(vi.Members) > 0 {
		vi.Members = append([]pool.MemberInfo(nil), vi.Members...)
		vi.Members[0].BadBlocks = p.bad
	}
	if vi.Health == pool.Healthy && (p.bad > 0 || p.lost > 0) {
		vi.Health = pool.Degraded
	}
	return vi
}

func (p *blockPool) Volume(name string) (pool.VolumeInfo, error) {
	vi, err := p.Pool.Volume(name)
	return p.withBlocks(vi), err
}

func (p *blockPool) Status() pool.Status {
	st := p.Pool.Status()
	for i := range st.Volumes {
		st.Volumes[i] = p.withBlocks(st.Volumes[i])
	}
	return st
}

// TestAgentBadBlocks: the engine's bad and lost block counts reach the Raid10Volume status
// (the volume, each member, the message and the Ready condition) through a real API server;
// a count that grows records one BadBlocks Warning Event with the counts, an unchanged count
// records none (not after an agent restart either), a falling one none.
func TestAgentBadBlocks(t *testing.T) {
	c, cfg := startAPI(t)
	ctx := t.Context()
	dir := t.TempDir()
	pcfg := fileDisks(t, dir, 4)
	pl, err := pool.Open(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	bp := &blockPool{Pool: pl}
	start := func() (stop func()) {
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- agent.Run(actx, cfg, agent.Options{NodeName: nodeName, Pool: bp, PollInterval: 100 * time.Millisecond})
		}()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent.Run: %v", err)
			}
		}
	}
	stop := start()
	defer func() { stop() }()

	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: nodeName, SizeBytes: volumeSize, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
	}}
	vol.Name = "pvc-bad-blocks"
	if err := c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	waitStatus := func(what string, cond func(st v1alpha1.Raid10VolumeStatus) bool) v1alpha1.Raid10VolumeStatus {
		t.Helper()
		var st v1alpha1.Raid10VolumeStatus
		waitFor(t, 30*time.Second, what, func() bool {
			st = getVolume(t, c, vol.Name).Status
			return cond(st)
		})
		return st
	}
	waitStatus("volume Ready and Healthy", func(st v1alpha1.Raid10VolumeStatus) bool {
		return st.Phase == v1alpha1.VolumePhaseReady && st.Health == v1alpha1.VolumeHealthHealthy
	})
	badEvents := func() []eventsv1.Event {
		var l eventsv1.EventList
		if err := c.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		var out []eventsv1.Event
		for _, e := range l.Items {
			if e.Reason == agent.EventBadBlocks && e.Regarding.Name == vol.Name {
				out = append(out, e)
			}
		}
		return out
	}
	waitEvents := func(n int, note string) {
		t.Helper()
		waitFor(t, 10*time.Second, "BadBlocks Events", func() bool {
			ev := badEvents()
			return len(ev) == n && strings.Contains(ev[n-1].Note+strings.Join(notes(ev), "|"), note)
		})
	}

	for _, step := range []struct {
		name        string
		bad, lost   int64
		health      v1alpha1.VolumeHealth
		events      int    // BadBlocks Events so far
		note, ready string // in the newest Event's note, in the Ready condition's message
	}{
		{"bad blocks", 3, 0, v1alpha1.VolumeHealthDegraded, 1, "3 bad blocks (was 0), 0 lost (was 0): member 0", "3 bad blocks (each still read from its other copy)"},
		{"unchanged", 3, 0, v1alpha1.VolumeHealthDegraded, 1, "", "3 bad blocks"},
		{"lost blocks", 5, 1, v1alpha1.VolumeHealthDegraded, 2, "5 bad blocks (was 3), 1 lost (was 0)", "5 bad blocks, 1 of them lost"},
		{"rewritten", 0, 0, v1alpha1.VolumeHealthHealthy, 2, "", "Healthy, 4/4 members in sync"},
	} {
		t.Run(step.name, func(t *testing.T) {
			bp.set(step.bad, step.lost)
			st := waitStatus("counts reported", func(st v1alpha1.Raid10VolumeStatus) bool {
				return st.BadBlocks == step.bad && st.LostBlocks == step.lost && st.Health == step.health
			})
			if st.Members[0].BadBlocks != step.bad || st.Members[1].BadBlocks != 0 || st.Phase != v1alpha1.VolumePhaseReady {
				t.Fatalf("status %+v", st)
			}
			if ready := st.Conditions[0]; !strings.Contains(ready.Message, step.ready) || ready.Status != "True" {
				t.Fatalf("Ready condition %+v, want %q in its message", ready, step.ready)
			}
			if step.note != "" {
				waitEvents(step.events, step.note)
			}
			time.Sleep(300 * time.Millisecond) // three polls: nothing more is recorded
			if ev := badEvents(); len(ev) != step.events {
				t.Fatalf("%d BadBlocks Events, want %d: %v", len(ev), step.events, notes(ev))
			}
		})
	}

	// A restarted agent takes the counts it finds in the status as reported.
	bp.set(5, 1)
	waitStatus("counts back", func(st v1alpha1.Raid10VolumeStatus) bool { return st.BadBlocks == 5 })
	waitEvents(3, "5 bad blocks (was 0), 1 lost (was 0)")
	stop()
	stop = start()
	time.Sleep(time.Second)
	if ev := badEvents(); len(ev) != 3 {
		t.Fatalf("%d BadBlocks Events after a restart, want 3: %v", len(ev), notes(ev))
	}
	for _, e := range badEvents() {
		t.Logf("event %s %s: %s", e.Type, e.Reason, e.Note)
		if e.Type != "Warning" {
			t.Errorf("event type %s, want Warning", e.Type)
		}
	}
}

func notes(ev []eventsv1.Event) []string {
	var out []string
	for _, e := range ev {
		out = append(out, e.Note)
	}
	return out
}
