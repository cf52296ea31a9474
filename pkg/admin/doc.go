// Package admin is the node's local admin surface: JSON over HTTP on a unix socket (mode
// 0600), served by every process that holds a node's pool (the standalone agent
// `kubectl-raid10 --local serve`, and the plugin in --mode=node and --mode=all) and used by
// `kubectl-raid10 --local`.
//
// API is what the local commands need of a pool. Two implementations: Client, a running
// process's admin socket, and Direct, the pool opened in the caller's own process when
// nothing serves it. Server answers the socket over any pool; what only some processes can
// do (create, delete and expand volumes outside the CSI path, with their NBD exports) is an
// optional VolumeOps hook, and without it those requests fail with
// pool.ErrFailedPrecondition.
//
// Errors cross the socket as a code naming the pool's sentinel (ErrorCodes) and the
// message; the client returns an error that matches the same sentinel with errors.Is.
package admin
