package raid10

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSetRatesMidway changes the rates of a running recovery and of a
// running scrub and checks that each phase goes at its own ceiling, as a
// ratio to that ceiling with loose bounds (the throttle's steps, a loaded
// test machine): a raise is followed at once, and a cut does not stall the
// work while it makes up for the faster phase before.
func TestSetRatesMidway(t *testing.T) {
	// Small rates and chunks: the fast phase stays well within what a
	// loaded machine under -race scrubs.
	const kib = 1 << 10
	t.Run("recovery", func(t *testing.T) {
		a := newRatesArray(t, Options{SyncRateMin: 128 * kib, SyncRateMax: 256 * kib})
		if err := a.FailMember(1); err != nil {
			t.Fatal(err)
		}
		if err := a.ReplaceMember(1, NewMemMember(16<<20)); err != nil {
			t.Fatal(err)
		}
		ratePhases(t, a, SyncRecovery, []ratePhase{
			{Rates{SyncMin: 64 * kib, SyncMax: 128 * kib}, 128 * kib},
			{Rates{SyncMin: 128 * kib, SyncMax: 1024 * kib}, 1024 * kib},
			{Rates{SyncMin: 64 * kib, SyncMax: 128 * kib}, 128 * kib},
		})
	})
	t.Run("scrub", func(t *testing.T) {
		a := newRatesArray(t, Options{SyncRateMin: 128 * kib, SyncRateMax: -1})
		if err := a.SetRates(Rates{SyncMin: 128 * kib, SyncMax: -1, ScrubMax: 256 * kib}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := a.Check(ctx); done <- err }()
		ratePhases(t, a, SyncCheck, []ratePhase{
			{Rates{SyncMin: 128 * kib, SyncMax: -1, ScrubMax: 256 * kib}, 256 * kib},
			{Rates{SyncMin: 128 * kib, SyncMax: -1, ScrubMax: 1024 * kib}, 1024 * kib},
			{Rates{SyncMin: 128 * kib, SyncMax: 4096 * kib, ScrubMax: 128 * kib}, 128 * kib},
		})
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("scrub ended with %v, want it cancelled mid-way", err)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		a := newRatesArray(t, Options{})
		if err := a.SetRates(Rates{SyncMin: -1}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("SetRates(SyncMin -1) = %v, want ErrInvalid", err)
		}
		if err := a.SetRates(Rates{}); err != nil || a.Rates() != (Rates{SyncMin: DefaultSyncRateMin, SyncMax: DefaultSyncRateMax}) {
			t.Fatalf("SetRates(zero) = %v, rates %+v: want the defaults", err, a.Rates())
		}
	})
}

// ratePhase is rates to set and the ceiling the work should then go at.
type ratePhase struct {
	rates   Rates
	ceiling int64
}

// newRatesArray is a clean two-member array of about 16 MiB in memory,
// with 16 KiB chunks.
func newRatesArray(t *testing.T, o Options) *Array {
	t.Helper()
	o.BitmapClearDelay = time.Hour
	a, err := Create([]Member{NewMemMember(16 << 20), NewMemMember(16 << 20)}, CreateOptions{
		Options: o, ChunkSize: 16 << 10, AssumeClean: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// ratePhases sets each phase's rates on a, whose background work of kind
// runs, and measures the phase's rate over a second from 50 ms after the
// change.
func ratePhases(t *testing.T, a *Array, kind SyncKind, phases []ratePhase) {
	t.Helper()
	done := func() int64 {
		s := a.Status().Sync
		if !s.Running || s.Kind != kind {
			t.Fatalf("no %v running: %+v", kind, s)
		}
		return s.Done
	}
	for i, ph := range phases {
		if err := a.SetRates(ph.rates); err != nil {
			t.Fatal(err)
		}
		if got := a.Rates(); got.SyncMax != ph.rates.SyncMax || got.ScrubMax != ph.rates.ScrubMax {
			t.Fatalf("phase %d: Rates() = %+v after SetRates(%+v)", i, got, ph.rates)
		}
		time.Sleep(50 * time.Millisecond)
		d0, t0 := done(), time.Now()
		time.Sleep(time.Second)
		d1, el := done(), time.Since(t0)
		ratio := float64(d1-d0) / el.Seconds() / float64(ph.ceiling)
		t.Logf("phase %d (%+v): %.1f MiB/s, %.2f of the ceiling", i, ph.rates, float64(d1-d0)/el.Seconds()/(1<<20), ratio)
		if ratio < 0.4 || ratio > 1.3 {
			t.Errorf("phase %d: %v at %.2f of its ceiling %d B/s, want 0.4 to 1.3", i, kind, ratio, ph.ceiling)
		}
	}
}
