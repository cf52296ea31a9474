package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestLocalBlocks: --local volumes and status show each volume's bad blocks (with the lost
// ones) and each member's bad blocks and deadline timeouts.
func TestLocalBlocks(t *testing.T) {
	vs := []pool.VolumeInfo{
		{Name: "clean", Size: 1 << 30, Health: pool.Healthy, InSync: 2, Members: []pool.MemberInfo{
			{Role: 0, DiskUUID: "aaaaaaaa-0000", State: "in-sync"}, {Role: 1, DiskUUID: "bbbbbbbb-0000", State: "in-sync"}}},
		{Name: "worn", Size: 1 << 30, Health: pool.Degraded, InSync: 2, BadBlocks: 9, LostBlocks: 4, Members: []pool.MemberInfo{
			{Role: 0, DiskUUID: "aaaaaaaa-0000", State: "in-sync", BadBlocks: 6, TimedOut: 1},
			{Role: 1, DiskUUID: "bbbbbbbb-0000", State: "in-sync", BadBlocks: 3}}},
	}
	var buf bytes.Buffer
	r := renderer{o: &Options{RunDir: t.TempDir()}, w: &buf}
	if err := r.status(pool.Status{Name: "default", Volumes: vs}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Logf("status:\n%s", out)
	for _, tc := range []struct {
		prefix string
		want   []string // fields from the second on
	}{
		{"clean ", []string{"1GiB", "Healthy", "2/2", "0", "-", "-", "-", "-"}},
		{"worn ", []string{"1GiB", "Degraded", "2/2", "9", "(4", "lost)", "-", "-", "-", "-"}},
		{"  worn ", []string{"ROLE", "DISK", "PATH", "STATE", "BAD", "BLOCKS", "TIMEOUTS"}},
	} {
		f := strings.Fields(lineOf(out, tc.prefix))
		if len(f) != len(tc.want)+1 || strings.Join(f[1:], " ") != strings.Join(tc.want, " ") {
			t.Errorf("row %q: %q, want %q", tc.prefix, f, tc.want)
		}
	}
	// The members of worn follow its header: role, disk, path, state, bad blocks, timeouts.
	lines := strings.Split(out, "\n")
	i := lineIndex(out, "  worn ")
	if i < 0 || i+2 >= len(lines) {
		t.Fatalf("no member table of worn")
	}
	for j, want := range []string{"0 aaaaaaaa - in-sync 6 1", "1 bbbbbbbb - in-sync 3 0"} {
		if got := strings.Join(strings.Fields(lines[i+1+j]), " "); got != want {
			t.Errorf("member row %d: %q, want %q", j, got, want)
		}
	}
}

// TestLocalLimits: --local volumes shows each volume's QoS limits in force in the LIMITS
// column and, under the table, what they delayed; a volume without limits shows "-" and no
// such line.
func TestLocalLimits(t *testing.T) {
	vs := []pool.VolumeInfo{
		{Name: "free", Size: 1 << 30, Health: pool.Healthy, InSync: 2, Members: make([]pool.MemberInfo, 2)},
		{Name: "capped", Size: 1 << 30, Health: pool.Healthy, InSync: 2, Members: make([]pool.MemberInfo, 2),
			Limits:   &raid10.Limits{ReadIOPS: 2000, ReadIOPSBurst: 200, ReadBytesPerSecond: 200 << 20, ReadBytesBurst: 20 << 20, WriteIOPS: 1000, WriteIOPSBurst: 100},
			Throttle: &raid10.ThrottleStatus{WritesDelayed: 3, WriteDelay: 40 * time.Millisecond, WriteBytesDelayed: 12 << 10}},
	}
	var buf bytes.Buffer
	r := renderer{o: &Options{RunDir: t.TempDir()}, w: &buf}
	if err := r.volumes(vs); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Logf("volumes:\n%s", out)
	for _, tc := range []struct{ prefix, want string }{
		{"free ", "free 1GiB Healthy 2/2 0 - - - -"},
		{"capped ", "capped 1GiB Healthy 2/2 0 - r:2000iops/200MiB/s,w:1000iops - -"},
		{"  capped:", "capped: throttled: reads 0 (0s, 0B), writes 3 (40ms, 12KiB)"},
	} {
		if got := strings.Join(strings.Fields(lineOf(out, tc.prefix)), " "); got != tc.want {
			t.Errorf("row %q: %q, want %q", tc.prefix, got, tc.want)
		}
	}
	if strings.Contains(out, "free: ") {
		t.Errorf("a volume without limits has a throttle line:\n%s", out)
	}
}
