// Package blockdev is the contract between a block device frontend and the device it serves.
//
// A frontend turns the kernel's block requests into calls on a Backend: the NBD server
// (package nbd, over a unix socket the kernel's nbd driver connects to) and the ublk server
// (package ublk, over io_uring) both serve one. The RAID10 engine (raid10.Array) implements
// Backend with every optional extension; nbd.FileBackend, a plain file for tests, implements
// the base interface and some extensions.
//
// # Methods
//
// Every method may be called concurrently, from every connection or queue of the device.
//
//   - ReadAt(p, off) fills p from byte offset off. A short read is an error.
//   - WriteAt(p, off) writes p at off. When it returns, every later ReadAt sees the data,
//     though it need not be durable yet.
//   - Size() is the device size in bytes. It may grow while the device is served (online
//     expansion) and never shrinks; frontends read it on every range check, so it must be
//     cheap (an atomic load).
//   - Flush() makes durable every write that completed before it was called.
//
// # Optional extensions
//
// A frontend finds these by a type assertion on the Backend and advertises the matching
// feature only where the kernel protocol lets it say so:
//
//   - FUAWriter.WriteAtFUA(p, off) writes p and returns once it is durable. Without it a
//     frontend serves a FUA write as WriteAt followed by Flush.
//   - Discarder.Discard(off, length) says the range is unused; later reads return zeroes or
//     the old data. Without it a discard (TRIM) succeeds and does nothing: it is advisory.
//   - ZeroWriter.WriteZeroes(off, length) sets the range to zeroes without being sent them;
//     later reads return zeroes.
//
// # Errors
//
// A backend reports a failure as an error that wraps a syscall.Errno where one of the
// meaningful values applies (ENOSPC: out of space; EINVAL: misaligned or out of range;
// EROFS, EPERM: the device refuses writes; EOPNOTSUPP: the operation is not supported).
// Errno reduces any error to one of those or EIO; each frontend then writes it in its own
// wire vocabulary. Errors are never classified by their text.
package blockdev
