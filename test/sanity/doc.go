// Package sanity runs the CSI conformance suite, csi-sanity
// (github.com/kubernetes-csi/csi-test/v5/pkg/sanity, in-process), against the plugin in
// --mode=all, the standalone mode: identity, controller and node in one process over the
// node's own pool, with no cluster.
//
// Everything is real: TestSanityVM (on the host) builds cmd/raid10-csi and this package's
// test binary and boots the test VM (test/vm) twice, once per access type of the suite's
// volumes (subtests mount and block). There TestSanityInGuest starts the built plugin on a
// pool of file disks, with its state directory and metrics endpoint, and runs the whole
// suite against its unix socket: volumes created in the pool, /dev/nbdX attached through
// netlink, mkfs.ext4, mounts, bind mounts of directories or device nodes into target paths,
// online expansion, volume stats and conditions. In the mount pass the plugin binary is
// built with -race, so a data race in the plugin fails the test (its exit status after
// SIGTERM is then 66, not 0); the block pass runs a plain build, three times faster on the
// emulated CPUs (issue 24). The ListSnapshots specs (20 snapshots, each a full copy) run in
// the block pass only: 83 s of the -race pass, 17 s of the plain one; every other snapshot
// spec runs in both, and each pass checks that all 18 snapshot specs ran in one of them.
//
// After the suite (the rest in the mount pass only): /metrics counted the suite's calls by method and code and reports the
// pool and no volume. Then a volume is created, staged as ext4 and written; the plugin is
// stopped (SIGTERM, exit status 0, the device left attached) and started again: the volume is
// listed, CreateVolume is idempotent and refuses xfs (the records kept ext4), NodeStageVolume
// is idempotent, and the data reads back through the reattached device. Its /dev/nbdX is
// then disconnected behind the plugin's back: /readyz must turn 503 naming the volume
// (within the 5 s grace plus a poll), and ok again once the volume is unstaged. At the end
// the records file holds no volume and SIGTERM stops the plugin cleanly.
//
// Run it with
//
//	go test -race -run TestSanityVM -v ./test/sanity/
//
// Sizes are small (16 MiB volumes, 256 MiB disks) because the guest runs under TCG, about
// ten times slower than the host. The suite's own spec counts (passed, skipped, pending) are
// in the log, in Ginkgo's "Ran N of M Specs" line.
package sanity
