package crypt

import (
	"os"
	"path/filepath"
)

// VolumeOpen reports whether the mapping of the volume volumeID (MapperName) is active in
// mapperDir ("": /dev/mapper): whether the volume is staged on this node through dm-crypt,
// so that what reaches its disks is ciphertext. It runs nothing, so the metrics and
// kubectl raid10 --local can ask it for every volume.
func VolumeOpen(mapperDir, volumeID string) bool {
	if mapperDir == "" {
		mapperDir = defaultMapper
	}
	return isDevice(filepath.Join(mapperDir, MapperName(volumeID)))
}

// isDevice reports whether path is a device node.
func isDevice(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeDevice != 0
}
