// Package sanity runs the CSI conformance suite, csi-sanity
// (github.com/kubernetes-csi/csi-test/v5/pkg/sanity, in-process), against the plugin in
// --mode=all, the standalone mode: identity, controller and node in one process over the
// node's own pool, with no cluster.
//
// Everything is real: TestSanityVM (on the host) builds cmd/raid10-csi and this package's
// test binary and boots the test VM (test/vm), where TestSanityInGuest starts the built
// plugin on a pool of file disks, with its state directory and metrics endpoint, and runs
// the whole suite against its unix socket: volumes created in the pool, /dev/nbdX attached
// through netlink, mkfs.ext4, mounts, bind mounts into target paths, online expansion,
// volume stats and conditions. After the suite it checks that no volume is left in the
// pool's records, that /metrics counted the CSI calls and reports the pool, that /readyz is
// ok, and that SIGTERM stops the plugin cleanly (exit status 0).
//
// Run it with
//
//	go test -race -run TestSanityVM -v ./test/sanity/
//
// Sizes are small (16 MiB volumes, 256 MiB disks) because the guest runs under TCG, about
// ten times slower than the host. The suite's own spec counts (passed, skipped, pending) are
// in the log, in Ginkgo's "Ran N of M Specs" line.
package sanity
