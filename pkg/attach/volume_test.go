package attach

import (
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestVolumeStateBlocks: NodeGetVolumeStats' condition from the pool: abnormal while
// Degraded, Rebuilding (with the progress) or Failed and whenever blocks are lost, with the
// bad and lost block counts in the message; normal while Healthy, also during a resync or
// a scrub.
func TestVolumeStateBlocks(t *testing.T) {
	mem := make([]pool.MemberInfo, 4)
	for _, tc := range []struct {
		name     string
		info     pool.VolumeInfo
		abnormal bool
		msg      string // the whole message
	}{
		{"healthy", pool.VolumeInfo{Size: 1 << 30, Health: pool.Healthy, InSync: 4, Members: mem}, false, ""},
		{"bad blocks", pool.VolumeInfo{Health: pool.Degraded, InSync: 4, Members: mem, BadBlocks: 5}, true,
			"volume is Degraded: 4 of 4 members in sync; 5 bad blocks (each still read from its other copy)"},
		{"lost blocks", pool.VolumeInfo{Health: pool.Degraded, InSync: 4, Members: mem, BadBlocks: 5, LostBlocks: 2}, true,
			"volume is Degraded: 4 of 4 members in sync; 2 blocks lost (bad on every copy: reads there fail with I/O errors until rewritten), 5 bad blocks in all"},
		{"rebuilding", pool.VolumeInfo{Health: pool.Rebuilding, InSync: 3, Members: mem,
			Sync: &pool.Progress{Kind: "recovery", Done: 64 << 20, Total: 256 << 20, Percent: 25, Rate: 100 << 20, ETA: 1920 * time.Millisecond}}, true,
			"volume is Rebuilding, redundancy reduced: 3 of 4 members in sync, recovery 25% (67108864 of 268435456 bytes, 104857600 bytes/s, ETA 2s)"},
		{"rebuild not started", pool.VolumeInfo{Health: pool.Rebuilding, InSync: 3, Members: mem}, true,
			"volume is Rebuilding, redundancy reduced: 3 of 4 members in sync"},
		{"resync", pool.VolumeInfo{Health: pool.Healthy, InSync: 4, Members: mem,
			Sync: &pool.Progress{Kind: "resync", Done: 1, Total: 2, Percent: 50}}, false, ""},
		{"scrub", pool.VolumeInfo{Health: pool.Healthy, InSync: 4, Members: mem,
			Sync: &pool.Progress{Kind: "check", Done: 1, Total: 2, Percent: 50}}, false, ""},
		{"bad blocks while rebuilding", pool.VolumeInfo{Health: pool.Rebuilding, InSync: 3, Members: mem, BadBlocks: 1}, true,
			"volume is Rebuilding, redundancy reduced: 3 of 4 members in sync; 1 bad blocks (each still read from its other copy)"},
		{"lost blocks while rebuilding", pool.VolumeInfo{Health: pool.Rebuilding, InSync: 3, Members: mem, BadBlocks: 2, LostBlocks: 2}, true,
			"volume is Rebuilding, redundancy reduced: 3 of 4 members in sync; 2 blocks lost (bad on every copy: reads there fail with I/O errors until rewritten), 2 bad blocks in all"},
		{"member down", pool.VolumeInfo{Health: pool.Degraded, InSync: 3, Members: mem}, true, "volume is Degraded: 3 of 4 members in sync"},
		{"failed", pool.VolumeInfo{Health: pool.Failed, Members: mem, Reason: "not assembled"}, true,
			"volume is Failed: 0 of 4 members in sync; not assembled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := volumeState(tc.info)
			if vs.Abnormal != tc.abnormal || vs.Message != tc.msg || vs.SizeBytes != int64(tc.info.Size) {
				t.Fatalf("%+v, want abnormal %v, message %q", vs, tc.abnormal, tc.msg)
			}
		})
	}
}
