package kernel

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Reclaim finds the devices leaked by a process that died between NBD_CMD_CONNECT and
// recording the device in the state file, and takes them back: every configured device whose
// backend identifier is ours ("raid10-csi:<volume>") and whose connecting process is gone. A
// leaked device of a volume with no record is recorded for it (the following reattach serves
// it again: requests the kernel queued on it complete); a leaked device of a volume recorded
// on another device is disconnected (nobody ever got its path). It returns the volumes it
// recorded. A device whose connecting process lives (this one, or a predecessor that has not
// finished its attach), or cannot be told, is never touched.
//
// Whether the connecting process lives is read from the owner files (owner.go): a volume
// listed as being connected by an owner whose file is locked has a live connector, whatever
// PID namespace it and this process run in; one listed only by dead owners has none. A volume
// no owner lists was connected by a version before owner files, or by a process of another
// state directory: the PID in /sys/block/nbdX/pid (the host's PID namespace) decides, when
// this process runs in the host's PID namespace; elsewhere the device is left alone. The files
// of dead owners are removed once their devices are dealt with.
func Reclaim(nl *Netlink, st *State) ([]string, error) {
	// The scan comes first: a dead owner connects nothing more, so every device it leaked
	// is in the list that follows.
	scan, err := scanOwners(st.ownersDir())
	if scan == nil {
		return nil, err
	}
	defer scan.release()
	errs := []error{err}
	devs, err := nl.Status(-1)
	if err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	var recorded []string
	for _, s := range devs {
		if !s.Connected {
			continue
		}
		id, err := BackendOf(s.Index)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		vol, ok := strings.CutPrefix(id, backendPrefix)
		if !ok || vol == "" {
			continue
		}
		if rec, ok := st.Get(vol); ok && rec.Index == s.Index {
			continue
		}
		if connectorLives(scan, vol, s.Index) {
			continue
		}
		if rec, ok := st.Get(vol); ok {
			klog.InfoS("Disconnecting a leaked NBD device", "volumeID", vol, "device", DevicePath(s.Index), "recorded", DevicePath(rec.Index))
			if err := nl.Disconnect(s.Index); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		klog.InfoS("Reclaiming a leaked NBD device", "volumeID", vol, "device", DevicePath(s.Index))
		if err := st.Put(vol, Record{Index: s.Index, BackendID: id}); err != nil {
			errs = append(errs, err)
			continue
		}
		recorded = append(recorded, vol)
	}
	if errors.Join(errs...) == nil {
		scan.removeDead() // every device a dead owner was connecting is dealt with
	}
	return recorded, errors.Join(errs...)
}

// connectorLives reports whether the process that connected the unrecorded device index of
// volumeID still lives, or cannot be told.
func connectorLives(scan *ownerScan, volumeID string, index uint32) bool {
	switch scan.of(volumeID) {
	case connectorAlive:
		return true
	case connectorDead:
		return false
	}
	if !inHostPIDNS() {
		klog.InfoS("Leaving an unrecorded NBD device alone: no owner file lists its volume, and its PID belongs to the host's PID namespace, which this process does not share",
			"volumeID", volumeID, "device", DevicePath(index))
		return true
	}
	return pidAlive(index)
}

// hostPIDNSInode is the inode of the initial PID namespace (PROC_PID_INIT_INO,
// include/linux/proc_ns.h): fixed since Linux 3.8.
const hostPIDNSInode = 0xEFFFFFFC

// inHostPIDNS reports whether this process runs in the host's (initial) PID namespace, the
// one whose PIDs /sys/block/nbdX/pid shows.
func inHostPIDNS() bool {
	ns, err := os.Readlink("/proc/self/ns/pid")
	return err == nil && ns == fmt.Sprintf("pid:[%d]", hostPIDNSInode)
}

// pidAlive reports whether the process /sys/block/nbdX/pid names lives (or cannot be told: no
// pid file, an unreadable one). Asked only in the host's PID namespace.
func pidAlive(index uint32) bool {
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/nbd%d/pid", index))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return true
	}
	return unix.Kill(pid, 0) != unix.ESRCH
}
