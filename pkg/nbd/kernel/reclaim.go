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
// backend identifier is ours ("raid10-csi:<volume>") and whose connecting process
// (/sys/block/nbdX/pid) is gone. A leaked device of a volume with no record is recorded for it
// (the following reattach serves it again: requests the kernel queued on it complete); a
// leaked device of a volume recorded on another device is disconnected (nobody ever got its
// path). It returns the volumes it recorded. A device whose process lives (this one, or a
// predecessor that handed over) is never touched.
func Reclaim(nl *Netlink, st *State) ([]string, error) {
	devs, err := nl.Status(-1)
	if err != nil {
		return nil, err
	}
	var recorded []string
	var errs []error
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
		if connectorAlive(s.Index) {
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
	return recorded, errors.Join(errs...)
}

// connectorAlive reports whether the process that connected device index still lives (or
// cannot be told: no pid file, an unreadable one).
func connectorAlive(index uint32) bool {
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
