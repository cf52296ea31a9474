package pool

import (
	"testing"
	"time"
)

func TestEvents(t *testing.T) {
	dir := t.TempDir()
	paths := makeDisks(t, dir, 5, 128<<20)
	cfg := configFor(paths[:4]...)
	cfg.RebuildRateMax = 16 << 20 // a rebuild of 32 MiB takes about 2 s: seen as Rebuilding
	p := openPool(t, cfg)
	defer p.Close()
	if _, err := p.CreateVolume("v", 64<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.FailDisk(paths[1]); err != nil {
		t.Fatal(err)
	}
	var seen []Event
	next := func(pred func(Event) bool) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case e := <-p.Events():
				seen = append(seen, e)
				if pred(e) {
					return
				}
			case <-timeout:
				t.Fatalf("event not seen; got %+v", seen)
			}
		}
	}
	health := func(h Health) func(Event) bool {
		return func(e Event) bool { return e.Kind == EventVolumeHealth && e.Volume == "v" && e.Health == h }
	}
	next(func(e Event) bool { return e.Kind == EventDiskFailed && e.DiskPath == paths[1] })
	next(health(Degraded))
	if _, err := p.ReplaceDisk(paths[1], DiskConfig{Path: paths[4]}); err != nil {
		t.Fatal(err)
	}
	next(func(e Event) bool { return e.Kind == EventDiskReplaced && e.DiskPath == paths[1] })
	next(health(Rebuilding))
	next(health(Healthy))
	if last := seen[len(seen)-1]; last.Previous != Rebuilding {
		t.Fatalf("Healthy after %s", last.Previous)
	}
}
