// Package perf holds the VM benchmark of the data path (`make bench-vm`): in one boot of the
// test VM (Debian's 6.12 kernel, for ublk_drv; RAID10_PERF_KERNEL=newest boots 7.3, whose
// ublk rows are zero-copy, with "ublk-copy" rows beside them) with 4 emulated NVMe disks (test/vm
// Options.Disks), md raid10 (near-2, no bitmap) on the first half of each disk beside the
// RAID10 engine on the second half (device-mapper linear halves, so both stay assembled),
// served to the guest's kernel by each frontend (frontend_test.go: NBD; ublk_test.go: ublk;
// crypt_test.go: NBD under a dm-crypt LUKS2 mapping, as an encrypted volume, with each case
// also run on the NBD device under it just before, the "nbd (paired)" rows; a frontend
// registers itself there; RAID10_PERF_FRONTENDS picks some), with fio libaio direct 4 KiB
// random reads and writes at queue depth 1 and 32 and 1 MiB sequential reads and writes at
// queue depth 8 (RAID10_PERF_CASES picks some by name; RAID10_PERF_JOBS runs that many fio
// jobs per case, on several CPUs and so several ublk queues), and the guest's pipe-copy throughput
// (dd | dd, 1 MiB blocks), the ceiling of large I/O under emulation, measured next to each
// 1 MiB case.
//
// Every figure is a ratio within the run: the VM runs under TCG on a shared machine, where
// absolute numbers mean little and the host's load drifts from minute to minute. So each
// frontend's run of a case comes right after md's run of the same case, the ratio is that
// pair's, and RAID10_PERF_ROUNDS repeats every pair (the table shows the round of median
// ratio). Per case and target the table gives the throughput, its ratio to md and (1 MiB
// cases) to the pipe copy, and per I/O: the CPU time of the serving process (utime+stime of
// the guest test process, which holds the server and the engine; fio runs in its own
// process), the guest's busy CPU time (/proc/stat: every process and the kernel, where
// dm-crypt's and md's work is), its read and write system calls (/proc/self/io syscr and
// syscw), the guest's context switches (every thread put to sleep and woken on the way of a
// request: fio's, the server's, the kernel's), the member operations (reads and writes
// completed on the NVMe disks, /sys/block/nvme*n1/stat) and the frontend's requests; the
// QD32 cases are run once more with strace -c attached to the serving process, for every
// system call per request. RAID10_PERF_SWITCHES=1 also logs which threads switched, per I/O
// and, for an attached device with no I/O, per second (switches_test.go). BenchmarkVM logs
// the table and the top of a CPU profile of the serving process in every case (its last
// round); docs/performance.md has runs.
package perf
