// Package atomicfile replaces a small file so that a crash leaves the old content or the new
// one, never a torn mix: the data goes to a temporary file in the same directory, which is
// synced, renamed over the target, and the directory is synced so that the rename itself is
// durable. The state files of the node (the NBD device map, the pool's disks file, the
// driver's volume records) are written this way.
//
// The file is created with mode 0600: these files are the node's own records, read only by
// the process that writes them. A replaced file gets that mode too.
package atomicfile
