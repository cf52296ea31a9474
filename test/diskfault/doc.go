// Package diskfault holds the VM tests of member faults under a real kernel: a RAID10
// array (pkg/raid10) over four device-mapper devices on brd ramdisks, served over NBD
// to the guest's own kernel (pkg/nbd/kernel attaches /dev/nbdX), with ext4 and fio on
// top. The faults are device-mapper tables swapped under the running array with
// dmsetup suspend / load / resume, as a disk that slows down or loses sectors would
// appear to md:
//
//   - TestSlowDiskInGuest: one member becomes a `delay` target far slower than
//     raid10.Options.MemberTimeout while fio writes and verifies through ext4. The
//     member must be failed at its deadline, I/O must go on from the other copy
//     (no fio error, completion latency bounded by the deadline plus 1 s), and after
//     the member is switched back to `linear`, re-added and rebuilt, a scrub must find
//     no mismatch.
//   - TestBadBlocksInGuest: `error` segments over a range of one member, then over an
//     overlapping range of its mirror: reads are served from the other copy while one
//     is readable, and only the blocks unreadable on both copies fail (EIO).
//   - TestComebackInGuest: a disk that goes away and comes back (a loose cable): one
//     member becomes an `error` target under fio writing and verifying on the raw
//     /dev/nbdX, is failed, switched back to `linear` and re-added; the bitmap-based
//     recovery must copy strictly less than a full rebuild of the member, with no fio
//     error and no scrub mismatch. Then the same with another member while a
//     rate-limited full rebuild onto a blank spare runs.
//
// TestDiskFaultVM (the host half) boots the VM and runs them all; on the host the in-guest
// halves skip (a [guest] skip, allowed in hack/skips.txt). The figures each run
// measured (latencies, IOPS before and during the stall, time to fail the member,
// rebuild time, mismatches) are logged as "figure:" lines.
package diskfault
