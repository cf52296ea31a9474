package vm

import (
	"context"
	"slices"
	"testing"
)

// TestGoCommand checks the two build configurations: a plain build gets -trimpath and
// CGO_ENABLED=0 (the image's flags), a -race build neither.
func TestGoCommand(t *testing.T) {
	t.Setenv("CGO_ENABLED", "1")
	plain := GoCommand(context.Background(), "test", "-c", "-o", "x.test", "./pkg")
	if want := []string{"go", "test", "-trimpath", "-c", "-o", "x.test", "./pkg"}; !slices.Equal(plain.Args, want) {
		t.Errorf("plain build args %q, want %q", plain.Args, want)
	}
	if n := len(plain.Env); n == 0 || plain.Env[n-1] != "CGO_ENABLED=0" {
		t.Errorf("plain build env does not end with CGO_ENABLED=0: %q", plain.Env)
	}
	race := GoCommand(context.Background(), "build", "-race", "-o", "p", "./cmd/x")
	if want := []string{"go", "build", "-race", "-o", "p", "./cmd/x"}; !slices.Equal(race.Args, want) {
		t.Errorf("race build args %q, want %q", race.Args, want)
	}
	if race.Env != nil {
		t.Errorf("race build env set (cgo must stay as the caller has it): %q", race.Env)
	}
}
