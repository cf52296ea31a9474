// Package perf holds the VM benchmark of the data path (`make bench-vm`): in one boot of the
// test VM (Debian's 6.12 kernel, for ublk_drv; RAID10_PERF_KERNEL=newest boots 7.3, whose
// ublk rows are zero-copy, with "ublk-copy" rows beside them) with 4 emulated NVMe disks (test/vm
// Options.Disks), md raid10 (near-2, no bitmap) over the disks beside the RAID10 engine over
// the same disks served to the guest's kernel by each frontend (frontend_test.go: NBD;
// ublk_test.go: ublk; crypt_test.go: NBD under a dm-crypt LUKS2 mapping, as an encrypted
// volume, with each case also run on the NBD device under it just before, the "nbd
// (paired)" rows; a frontend registers itself there; RAID10_PERF_FRONTENDS picks some), with fio
// libaio direct 4 KiB random reads and writes at queue depth 1 and 32 and 1 MiB sequential
// reads and writes at queue depth 8, and the guest's pipe-copy throughput (dd | dd, 1 MiB
// blocks), the ceiling of large I/O under emulation, measured next to each 1 MiB case.
//
// Every figure is a ratio within the run: the VM runs under TCG on a loaded machine, where
// absolute numbers mean little. Per case and target the table gives the throughput, its
// ratio to md and (1 MiB cases) to the pipe copy, and per I/O: the CPU time of the serving
// process (utime+stime of the guest test process, which holds the server and the engine;
// fio runs in its own process), the guest's busy CPU time (/proc/stat: every process and
// the kernel, where dm-crypt's and md's work is), its read and write system calls (/proc/self/io syscr and
// syscw), the member operations (reads and writes completed on the NVMe disks,
// /sys/block/nvme*n1/stat) and the frontend's requests; the QD32 cases are run once more
// with strace -c attached to the serving process, for every system call per request.
// BenchmarkVM logs the table and the top of a CPU profile of the serving process in every
// case; docs/performance.md has a run.
package perf
