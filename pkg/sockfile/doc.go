// Package sockfile makes and removes the unix socket files that a process hands over to its
// successor at one path: the node plugin's CSI socket, its kubelet registration socket and
// its admin socket, which a plugin started beside the running one (a surge update) takes
// over while the old one stops.
//
// The successor replaces the file (remove, bind) and the predecessor, when it stops, removes
// the file only while it is still its own (stat, compare, remove). Done bare, the two
// interleave badly: the predecessor stats its own file, the successor removes it and binds a
// new one, and the predecessor's remove then deletes the successor's file, which leaves the
// successor listening on a socket nobody can reach (or failing the stat of its own file).
// Both sides therefore hold an exclusive flock(2) on a lock file beside the socket,
// ".<socket name>.lock", while they replace or remove it. The lock file is a regular file
// that stays; the kubelet's plugin watcher ignores it (not a socket, and hidden).
package sockfile
