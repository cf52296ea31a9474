package pool

import (
	"errors"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestSetVolumeLimits: limits reach the running array at once, are refused with
// ErrInvalidArgument naming a negative field (the ones in force stay), are kept for a
// volume not assembled and given to it when it is, and come back at every assembly in this
// process; a new process (Open) starts without them, the caller sets them again.
func TestSetVolumeLimits(t *testing.T) {
	c := configFor(makeDisks(t, t.TempDir(), 2, testDiskSize)...)
	p := openPool(t, c)
	for _, name := range []string{"v", "w"} {
		if _, err := p.CreateVolume(name, 16<<20, CreateOptions{Members: 2}); err != nil {
			t.Fatal(err)
		}
	}
	lim := raid10.Limits{ReadIOPS: 500, WriteBytesPerSecond: 8 << 20, WriteBytesBurst: 1 << 20}
	inForce := func(name string) raid10.Limits {
		t.Helper()
		a, err := p.Array(name)
		if err != nil {
			t.Fatal(err)
		}
		return a.Status().Limits
	}
	want := raid10.Limits{ReadIOPS: 500, ReadIOPSBurst: 50, WriteBytesPerSecond: 8 << 20, WriteBytesBurst: 1 << 20}

	if err := p.SetVolumeLimits("v", lim); err != nil {
		t.Fatal(err)
	}
	if got := inForce("v"); got != want {
		t.Fatalf("limits in force %+v, want %+v", got, want)
	}
	if got := inForce("w"); got != (raid10.Limits{}) {
		t.Fatalf("another volume got limits: %+v", got)
	}

	cases := []struct {
		name    string
		vol     string
		l       raid10.Limits
		is      error
		mention string
	}{
		{"negative", "v", raid10.Limits{WriteIOPS: -1}, ErrInvalidArgument, "WriteIOPS"},
		{"negative burst", "v", raid10.Limits{ReadIOPS: 1, ReadBytesBurst: -4096}, raid10.ErrInvalid, "ReadBytesBurst"},
		{"unknown volume", "nope", lim, ErrNotFound, `"nope"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := p.SetVolumeLimits(tc.vol, tc.l)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("SetVolumeLimits(%q, %+v) = %v, want %v naming %s", tc.vol, tc.l, err, tc.is, tc.mention)
			}
		})
	}
	if got := inForce("v"); got != want {
		t.Fatalf("a refused change moved the limits in force to %+v", got)
	}

	// Re-assembly in this process, as a returning disk or a resumed copy does it: the
	// array is new, the limits come back. And a volume not assembled when its limits are
	// set gets them at its assembly.
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
		t.Fatalf("after re-assembly: limits %+v, want %+v", got, want)
	}
	reassemble("w", func() {
		if err := p.SetVolumeLimits("w", lim); err != nil {
			t.Fatalf("limits on a volume not assembled: %v", err)
		}
	})
	if got := inForce("w"); got != want {
		t.Fatalf("a volume assembled after its limits were set: %+v, want %+v", got, want)
	}
	// Lifting them: zero is unlimited, kept as well.
	if err := p.SetVolumeLimits("w", raid10.Limits{}); err != nil {
		t.Fatal(err)
	}
	reassemble("w", func() {})
	if got := inForce("w"); got != (raid10.Limits{}) {
		t.Fatalf("lifted limits came back at re-assembly: %+v", got)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.SetVolumeLimits("v", lim); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetVolumeLimits after Close = %v, want ErrClosed", err)
	}
	p = openPool(t, c)
	defer p.Close()
	if got := inForce("v"); got != (raid10.Limits{}) {
		t.Fatalf("limits after a restart: %+v, want none (the caller sets them again)", got)
	}
}

// TestVolumeInfoLimits: Volume (and Status) report the limits in force on the array, with
// their bursts, and the throttle counts; a volume without limits reports neither.
func TestVolumeInfoLimits(t *testing.T) {
	c := configFor(makeDisks(t, t.TempDir(), 2, testDiskSize)...)
	p := openPool(t, c)
	defer p.Close()
	for _, name := range []string{"v", "w"} {
		if _, err := p.CreateVolume(name, 16<<20, CreateOptions{Members: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.SetVolumeLimits("v", raid10.Limits{WriteIOPS: 100, WriteIOPSBurst: 1}); err != nil {
		t.Fatal(err)
	}
	a, err := p.Array("v")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := range 4 {
		if _, err := a.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	vi, err := p.Volume("v")
	if err != nil {
		t.Fatal(err)
	}
	if vi.Limits == nil || *vi.Limits != (raid10.Limits{WriteIOPS: 100, WriteIOPSBurst: 1}) {
		t.Fatalf("VolumeInfo.Limits = %+v, want the limits in force", vi.Limits)
	}
	if vi.Throttle == nil || vi.Throttle.WritesDelayed == 0 || vi.Throttle.WriteBytesDelayed != vi.Throttle.WritesDelayed*4096 {
		t.Fatalf("VolumeInfo.Throttle = %+v, want the delayed writes and their bytes", vi.Throttle)
	}
	if wi, err := p.Volume("w"); err != nil || wi.Limits != nil || wi.Throttle != nil {
		t.Fatalf("a volume without limits: limits %+v, throttle %+v, %v", wi.Limits, wi.Throttle, err)
	}
}
