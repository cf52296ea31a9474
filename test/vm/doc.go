// Package vm boots the host's distribution kernel under QEMU and runs a shell
// command or a compiled Go test binary inside it, as root, with the kernel pieces
// raid10-csi relies on loaded: nbd, md (raid0/1/10), brd, null_blk, loop, ext4, xfs.
// The test machines' own kernels have no nbd and no md, so every test of the kernel
// NBD client or of md goes through here.
//
// # Use
//
//	func TestKernelNBD(t *testing.T) {
//		vm.HostHalf(t)
//		vm.RunGoTestOpts(t, vm.Options{Env: []string{"NBD_TEST=1"},
//			Tests: []string{"TestInKernelAttach", "TestInKernelKill9"}},
//			"./pkg/nbd", "-test.run=^TestInKernel")
//	}
//
// builds ./pkg/nbd's test binary (`go test -c`; once per process, package and build
// flags: a package whose tests boot several VMs links it once), runs it in the guest in the
// package directory with -test.v, streams its output to t.Log, and fails t on a
// non-zero exit, and also unless each of Tests reported "--- PASS" there (none
// skipped, no "no tests to run"): an in-guest test that was renamed or skipped in
// the guest fails its host half. A -test.run that is a plain list (^TestA$,
// ^(TestA|TestB)$) names the tests by itself. In the guest RAID10_IN_VM=1
// (vm.InGuest()), so the in-guest test skips on the host; the pattern is a pair of
// tests in the same package:
//
//	func TestInKernelAttach(t *testing.T) {
//		vm.GuestHalf(t, "TestKernelNBD") // a [guest] skip on the host
//		// root, /dev/nbd0.., netlink, mkfs, fio, kill -9: all real here
//	}
//
// Require and HostHalf skip inside the guest, so a host-side test never recurses.
// For a shell command:
//
//	res, err := vm.Run(ctx, vm.Options{Timeout: 2 * time.Minute}, "mdadm --version")
//	// err: the VM failed (ErrTimeout, ErrNoExitStatus; text has the console tail)
//	// res.ExitCode, res.Output (stdout+stderr), res.ConsoleLog, res.Duration
//
// and from a shell (`make e2e` and humans): `go run ./test/vm/cmd/vmrun -- CMD`, or
// `go run ./test/vm/cmd/vmrun -gotest ./pkg/nbd -- -test.v`. BuildGoTest builds a
// test binary once for several Run calls.
// vm.Require(t) skips a test in -short mode and with RAID10_SKIP_HEAVY, and when QEMU
// or the kernel is missing ends it through testenv.Missing: a skip on a developer's
// machine, a failure under CI (internal/testenv says what counts as CI).
//
// Options.Disks attaches raw image files as emulated NVMe controllers (with serials, as
// /dev/nvmeXn1) or virtio-blk disks; Options.Net gives the guest eth0 on QEMU's user network
// with restrict=on, whose only way out are the guestfwd commands (one host process per guest
// connection). test/cluster uses both for its Kubernetes node.
//
// # Rigs shared by the in-guest tests
//
// The in-guest halves of test/diskfault, test/perf and the frontends' packages build
// their rigs from these, a file per concern:
//
//   - exec.go: Sh (run a command, log it with its duration, fail on error),
//     RequireTools, LogDmesg, NoKernelWarning.
//   - disks.go: SparseFile(s), LoopDevices, DMDisk (a device-mapper member whose table
//     a test swaps: Linear, Delayed, WithErrors, Dead), BlockSize, QueueAttr, MkfsExt4,
//     Mount.
//   - fio.go: FioJob (libaio, O_DIRECT, optional crc32c verification), FioVerify, RunFio
//     with its JSON report (ParseFio), and FioUnderKills: fio writing with verification
//     while the serving process is killed and started again, the restart test of every
//     frontend.
//   - proc.go: StartSelf, the test binary run again as a serving process that prints
//     READY, and Proc's Kill (a crash) and Stop (SIGTERM).
//   - bench.go: md raid10 (CreateMD) against the engine (CreateArray) over the same
//     disks in one boot, CPUProfile in the guest and PprofTop on the host.
//
// # How it works
//
//   - Kernel: the newest /boot/vmlinuz-<kver> of DefaultKernelSeries (6.1, Debian 12's)
//     that has /lib/modules/<kver>/modules.dep, else the newest of any series; a test
//     asks for another series with Options.KernelSeries (the ublk tests boot
//     UblkKernelSeries, 6.12, and NewestKernelSeries, 7.3); RAID10_VM_KERNEL=/boot/vmlinuz-<kver>
//     (or <cache>/kernel-<kver>/vmlinuz) overrides either when it is of that series. Besides
//     /boot, the kernels unpacked into ${RAID10_CACHE:-~/.cache/raid10-csi}/kernel-<kver>
//     (vmlinuz, lib/modules/<kver> with its modules.dep) count: hack/install-deps.sh puts
//     Debian trixie-backports' NEWEST_KERNEL_VERSION (hack/versions.sh) there without
//     installing it. For such a kernel the host's modprobe runs with -d <that directory>, and
//     the guest mounts a tmpfs over the chroot's /lib/modules and binds the kernel's modules
//     at /lib/modules/<kver>, so modprobe in the guest works as for an installed kernel. A
//     test that asks for a series not found fails under CI and skips elsewhere
//     (RunGoTestOpts, testenv.Missing).
//   - Initramfs: static busybox, the modules needed to mount 9p (virtio_pci,
//     9pnet_virtio, 9p, virtio-rng and what `modprobe -S <kver> --show-depends`
//     lists before them, in that order; .ko.xz/.ko.zst/.ko.gz are decompressed since
//     busybox insmod takes plain ELF) and /init (init.sh). Written in Go as a newc
//     cpio (no cpio tool needed), uncompressed, cached as
//     ${RAID10_CACHE:-~/.cache/raid10-csi}/vm/initramfs-<kver>-<content hash>.cpio and
//     reused while kernel, modules, busybox and init.sh are unchanged.
//   - QEMU: `-accel tcg,thread=multi -cpu max -machine pc -nodefaults`, serial
//     console on stdio (captured as the console log), kernel command line
//     `console=ttyS0 panic=-1 loglevel=5 tsc=reliable` (without it the guest marks
//     TCG's TSC unstable and reads the clock from the HPET, a trap per read: every
//     clock_gettime, hence every Go scheduler pass, costs microseconds, 15% of an NBD
//     server's CPU in the benchmark), `-no-reboot`, a virtio-rng, no NIC
//     (loopback is up). The kernel booted is the vmlinux extracted once from the
//     bzImage into the cache (vmlinux-<kver>-<hash>; Debian's kernel has CONFIG_PVH,
//     so QEMU enters it directly) with qboot as firmware when
//     /usr/share/qemu/qboot.rom exists; otherwise the bzImage with SeaBIOS. Under
//     TCG the kernel's own xz decompression took about 10 s of every boot.
//   - Shares over virtio 9p: the host root read-only (tag hostroot, cache=loose),
//     a per-run directory read-write (tag vmrun, under CacheDir()/runs) and each
//     Options.Writable directory read-write (tags rw1..). The guest mounts the host
//     root at /host, fresh proc, sysfs, devtmpfs, devpts and tmpfs on /tmp, /run,
//     /var/tmp, /dev/shm under it, then the read-write shares at their host paths
//     (mkdir'ing the mount point in the guest tmpfs when it is under /tmp), and
//     loads the modules with the host's own kmod modprobe inside `chroot /host`
//     (softdeps and dependencies resolved from the host's /lib/modules/<kver>).
//   - The command: the run directory holds config.sh (shares, modules), env.sh
//     (exports) and script.sh; init moves /host to the mount namespace's / (as
//     switch_root does, so `nsenter --mount=/proc/1/ns/mnt`, Kubernetes' host-exec
//     pods, lands in the host root; init itself keeps the initramfs as its root) and
//     runs `chroot <host root> /bin/sh script.sh` in
//     Options.Dir with stdout+stderr to <run>/output, writes the exit status to
//     <run>/exit (write to exit.tmp, then rename), syncs and `poweroff -f`s. The host
//     follows <run>/output while the guest runs (Options.Stdout) and reads the exit
//     file after QEMU exits: no parsing of the serial console, so kernel messages
//     can never corrupt the output or the status.
//   - Watchdog: from Timeout >= 90 s (or Options.Watchdog), init gives the command
//     Timeout-60s, then sends its session SIGQUIT (a Go binary prints all goroutine
//     stacks into the output), SIGKILL 10 s later, and Run returns ErrTimeout with
//     the output tail: a hung in-guest test says where it hung.
//   - Failure: QEMU runs in its own process group; at Options.Timeout (or when
//     the context ends) the whole group gets SIGKILL and Run returns ErrTimeout with
//     the console tail. QEMU exiting without an exit file (kernel panic; init's
//     FATAL lines; panic=-1 + -no-reboot make a panic end QEMU) is ErrNoExitStatus,
//     with the console tail; the tail keeps the "Kernel panic", BUG, Oops, WARNING
//     and FATAL lines that a long stack trace would push out of it. A guest that
//     reported its status but does not power off within 30 s is killed, and the
//     run still counts. PR_SET_PDEATHSIG kills QEMU if the test process dies.
//
// # Pitfalls found
//
//   - KVM hangs on these machines ("Booting from ROM"): TCG only, so everything is
//     about 10x slower than native; compare ratios inside one run, never absolutes.
//   - Busybox is built with "prefer applets": `chroot /host modprobe` runs busybox's
//     own modprobe (no softdeps: libcrc32c then fails with "unknown symbol"), so
//     host programs are called by full path (/sbin/modprobe, /bin/sh).
//   - /etc/modprobe.d of the host applies in the guest (Debian: md_mod start_ro=1,
//     nbd max_part=15), as on a real node. Options.ModuleParams adds parameters.
//   - The guest mounts tmpfs on /tmp: a host file under /tmp is invisible there
//     unless its directory is in Options.Writable (or is Options.Dir). Test binaries
//     are therefore built under CacheDir()/bin.
//   - Every exec of a host binary reads it over 9p; cache=loose on the read-only
//     root share makes the second exec cheap. A file changed on the host during a
//     run may be seen stale in the guest through that share (not through the
//     read-write shares, which are uncached).
//   - Shared paths may not contain commas or spaces (QEMU's -virtfs syntax, init's
//     shell); Run rejects them.
//   - nbd-client 3.24 speaks to a unix socket with `-u PATH`, and wants `-N name`
//     (else it warns about the dropped oldstyle protocol and uses the default export).
//   - `mdadm --create` asks for confirmation when members look used: pass --run.
//   - No udev in the guest: /dev/md/<name> and /dev/disk/by-* links do not appear;
//     use /dev/mdN, /dev/nbdN. devtmpfs creates the nodes themselves.
//   - A test binary that blocks in select{} is reported by the Go runtime as a
//     deadlock at once; hang with time.Sleep to test timeouts.
//   - Under heavy host load (load average 15-20 on 2 cores while other builds ran)
//     a 1-vCPU guest booted faster than a 2-vCPU one (11 s vs 16 s wall); the
//     default stays 2 for SMP realism, small tests use CPUs: 1.
//
// # Times measured (2-core host, load average 15-20 from concurrent builds)
//
//   - initramfs build: 0.5 s cold (3 MB, uncompressed), 0.14 s to find it cached;
//     vmlinux extraction: about 3 s, once per kernel.
//   - boot to "ready" (modules loaded, shares mounted): 9-24 s wall with the
//     vmlinux+qboot path, depending on load (was 20-25 s with the bzImage and
//     SeaBIOS at the same load); a trivial command end to end 10-20 s.
//   - the whole package (7 boots, 3-4 of them in parallel): 90-150 s.
//   - test binaries built with -race run in the guest (the host's libc is there).
//   - smoke test (one boot, NBD and raid10 steps): about 40 s wall; each guest step
//     (attach, mkfs.ext4, mount/write/umount, detach, read back, mdadm create,
//     8 MiB write/read, degraded read) 0.5-4 s of guest time.
package vm
