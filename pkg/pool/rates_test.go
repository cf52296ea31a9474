package pool

import (
	"errors"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestSetVolumeRates: rates reach the running array at once over the node's (a field of 0
// takes the pool's RebuildRateMax or the engine's default), a negative one is refused
// naming it, they are kept for a volume not assembled and given to it when it is, come back
// at every re-assembly in this process, and raid10.Rates{} returns the volume to the node's.
func TestSetVolumeRates(t *testing.T) {
	c := configFor(makeDisks(t, t.TempDir(), 2, testDiskSize)...)
	c.RebuildRateMax = 64 << 20
	p := openPool(t, c)
	defer p.Close()
	for _, name := range []string{"v", "w"} {
		if _, err := p.CreateVolume(name, 16<<20, CreateOptions{Members: 2}); err != nil {
			t.Fatal(err)
		}
	}
	inForce := func(name string) raid10.Rates {
		t.Helper()
		a, err := p.Array(name)
		if err != nil {
			t.Fatal(err)
		}
		return a.Rates()
	}
	node := raid10.Rates{SyncMin: raid10.DefaultSyncRateMin, SyncMax: 64 << 20}
	set := raid10.Rates{ScrubMax: 8 << 20, SyncMin: 2 << 20}
	want := raid10.Rates{SyncMin: 2 << 20, SyncMax: 64 << 20, ScrubMax: 8 << 20}

	if err := p.SetVolumeRates("v", set); err != nil {
		t.Fatal(err)
	}
	if got := inForce("v"); got != want {
		t.Fatalf("rates in force %+v, want %+v", got, want)
	}
	if got := inForce("w"); got != node {
		t.Fatalf("another volume's rates: %+v, want the node's %+v", got, node)
	}
	for _, tc := range []struct {
		name, vol, mention string
		r                  raid10.Rates
		is                 error
	}{
		{"negative", "v", "ScrubMax", raid10.Rates{ScrubMax: -1}, ErrInvalidArgument},
		{"negative max", "v", "SyncMax", raid10.Rates{SyncMax: -1}, ErrInvalidArgument},
		{"unknown volume", "nope", `"nope"`, set, ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := p.SetVolumeRates(tc.vol, tc.r); !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("SetVolumeRates(%q, %+v) = %v, want %v naming %s", tc.vol, tc.r, err, tc.is, tc.mention)
			}
		})
	}
	if got := inForce("v"); got != want {
		t.Fatalf("a refused change moved the rates in force to %+v", got)
	}

	reassemble := func(name string, between func()) {
		t.Helper()
		p.mu.Lock()
		v := p.byName[name]
		if err := v.arr.Close(); err != nil {
			p.mu.Unlock()
			t.Fatal(err)
		}
		v.arr = nil
		p.mu.Unlock()
		between()
		p.mu.Lock()
		p.assemble(v)
		p.mu.Unlock()
	}
	reassemble("v", func() {})
	if got := inForce("v"); got != want {
		t.Fatalf("after re-assembly: rates %+v, want %+v", got, want)
	}
	own := raid10.Rates{SyncMax: 16 << 20}
	reassemble("w", func() {
		if err := p.SetVolumeRates("w", own); err != nil {
			t.Fatalf("rates on a volume not assembled: %v", err)
		}
	})
	if got, want := inForce("w"), (raid10.Rates{SyncMin: raid10.DefaultSyncRateMin, SyncMax: 16 << 20}); got != want {
		t.Fatalf("a volume assembled after its rates were set: %+v, want %+v", got, want)
	}
	if err := p.SetVolumeRates("w", raid10.Rates{}); err != nil {
		t.Fatal(err)
	}
	if got := inForce("w"); got != node {
		t.Fatalf("rates back to the node's: %+v, want %+v", got, node)
	}
	reassemble("w", func() {})
	if got := inForce("w"); got != node {
		t.Fatalf("cleared rates came back at re-assembly: %+v", got)
	}
}
