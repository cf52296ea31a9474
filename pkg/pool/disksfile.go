package pool

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/internal/atomicfile"
)

// DisksFileName is the name the plugin gives Config.DisksFile in its state directory.
const DisksFileName = "pool-disks.json"

// disksFileVersion is the format version of Config.DisksFile.
const disksFileVersion = 1

// disksFile is the JSON content of Config.DisksFile: the disks the pool was given at run time
// (AddDisk, ReplaceDisk) on paths its configured disk list does not cover. Open treats them
// as listed, so that a restart finds them. Documented in docs/on-disk-format.md.
type disksFile struct {
	Version int          `json:"version"`
	Disks   []diskRecord `json:"disks"`
}

// diskRecord is one disk of Config.DisksFile.
type diskRecord struct {
	// Path is the path the disk was given under (no glob).
	Path string `json:"path"`
	// Disk is the disk UUID its label carries (informational at Open; used to drop the
	// record when the disk is replaced itself).
	Disk string `json:"disk"`
}

// loadDisksFile reads Config.DisksFile; a missing file (or no file configured) holds no disk.
// A file that cannot be parsed is an error naming it: the pool would otherwise start without
// disks it was explicitly given, and their volumes Degraded.
func loadDisksFile(path string) ([]diskRecord, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pool: disksFile: %w", err)
	}
	var f disksFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: disksFile %s: %w (it records the disks added or replaced at run time; repair it, or list its disks in the configuration and remove it)",
			ErrInvalidArgument, path, err)
	}
	if f.Version != disksFileVersion {
		return nil, fmt.Errorf("%w: disksFile %s: version %d, this build reads version %d", ErrInvalidArgument, path, f.Version, disksFileVersion)
	}
	for i, r := range f.Disks {
		if r.Path == "" || hasMeta(r.Path) {
			return nil, fmt.Errorf("%w: disksFile %s: disks[%d].path %q: must be a path, not empty nor a glob", ErrInvalidArgument, path, i, r.Path)
		}
		if _, err := ParseUUID(r.Disk); err != nil {
			return nil, fmt.Errorf("%w: disksFile %s: disks[%d].disk: %w", ErrInvalidArgument, path, i, err)
		}
	}
	return f.Disks, nil
}

// saveRecords writes recs to Config.DisksFile atomically (atomicfile.Write: a crash leaves
// the old or the new file). Caller holds p.mu.
func (p *Pool) saveRecords(recs []diskRecord) error {
	if recs == nil {
		recs = []diskRecord{}
	}
	b, err := json.MarshalIndent(disksFile{Version: disksFileVersion, Disks: recs}, "", "  ")
	if err != nil {
		return fmt.Errorf("pool: encode disksFile: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(p.cfg.DisksFile), 0o700); err != nil {
		return fmt.Errorf("pool: disksFile: %w", err)
	}
	if err := atomicfile.Write(p.cfg.DisksFile, append(b, '\n')); err != nil {
		return fmt.Errorf("pool: disksFile: %w", err)
	}
	p.records = recs
	return nil
}

// record notes in Config.DisksFile that the disk with UUID u was given on path, unless no
// file is configured or the configured list or the file covers path already (then only the
// UUID is brought up to date). It is written before the disk is claimed or taken back: a
// crash in between leaves a record whose disk carries no label, which Open refuses (it
// claims nothing from the file). Caller holds p.mu.
func (p *Pool) record(path string, u UUID) error {
	if p.cfg.DisksFile == "" || p.listedInConfig(path) {
		return nil
	}
	recs := append([]diskRecord(nil), p.records...)
	found := false
	for i := range recs {
		if recs[i].Path == path {
			if recs[i].Disk == u.String() {
				return nil
			}
			recs[i].Disk, found = u.String(), true
		}
	}
	if !found {
		recs = append(recs, diskRecord{Path: path, Disk: u.String()})
	}
	if err := p.saveRecords(recs); err != nil {
		return err
	}
	klog.InfoS("Disk recorded for the next start", "disk", path, "diskUUID", u, "file", p.cfg.DisksFile)
	return nil
}

// unrecord drops the records of disk u (replaced itself, or never claimed after all).
// Failing to is logged, not returned: a stale record is harmless (its disk shows Removed, or
// Refused when it no longer carries this pool's label). Caller holds p.mu.
func (p *Pool) unrecord(u UUID) {
	var recs []diskRecord
	for _, r := range p.records {
		if r.Disk != u.String() {
			recs = append(recs, r)
		}
	}
	if len(recs) == len(p.records) {
		return
	}
	if err := p.saveRecords(recs); err != nil {
		klog.ErrorS(err, "Dropping a disk's record", "diskUUID", u, "file", p.cfg.DisksFile)
	}
}
