package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestLocalScrub runs `scrub` through the agent's admin socket and, with no agent, over the
// pool opened in this process (which follows the scrub to its end).
func TestLocalScrub(t *testing.T) {
	_, o := setup(t, 4)
	runOK(t, o, "create", "v1", "32Mi")
	runOK(t, o, "create", "v2", "32Mi")
	out := runOK(t, o, "scrub", "v1")
	if !strings.Contains(out, "v1: check Done 100.0%") || !strings.Contains(out, "0 mismatches") {
		t.Fatalf("scrub without an agent:\n%s", out)
	}

	startAgent(t, o)
	agentOnly := *o
	agentOnly.PoolConfig = ""
	out = runOK(t, &agentOnly, "scrub", "--all", "--repair", "--follow")
	for _, want := range []string{"v1: repair Done 100.0%", "v2: repair Done 100.0%", "0 repaired"} {
		if !strings.Contains(out, want) {
			t.Fatalf("scrub --all --repair --follow lacks %q:\n%s", want, out)
		}
	}
	out = runOK(t, &agentOnly, "scrub", "v2", "-o", "json")
	if !strings.Contains(out, `"volume":"v2"`) || !strings.Contains(out, `"kind":"check"`) {
		t.Fatalf("scrub -o json:\n%s", out)
	}
	runOK(t, &agentOnly, "scrub", "v2", "--stop")
	for _, tc := range []struct {
		name string
		args []string
		want error  // a sentinel, or nil for a usage error
		text string // in the message
	}{
		{"NoVolume", []string{"scrub"}, nil, "usage"},
		{"VolumeAndAll", []string{"scrub", "v1", "--all"}, nil, "usage"},
		{"Unknown", []string{"scrub", "nope"}, pool.ErrNotFound, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := run(context.Background(), &agentOnly, tc.args, &buf)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("%v: %v, want %v (%q)", tc.args, err, tc.want, tc.text)
			}
		})
	}
}
