package pool

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// AllocPolicy chooses where on a disk a new extent goes.
type AllocPolicy string

// Allocation policies.
const (
	// FirstFit takes the lowest free range that is large enough (the default: extents pack
	// towards the start of the disk, keeping the tail free for growth).
	FirstFit AllocPolicy = "first-fit"
	// BestFit takes the smallest free range that is large enough (less fragmentation when
	// volumes of many sizes come and go).
	BestFit AllocPolicy = "best-fit"
)

// DefaultAlignment is the default extent alignment: 1 MiB, like partitioning tools.
const DefaultAlignment = 1 << 20

// DiskConfig is one entry of the pool's disk list.
type DiskConfig struct {
	// Path is a block device, a regular file, or a glob matching either
	// (e.g. /dev/disk/by-id/nvme-*). A glob matching nothing is not an error.
	Path string `json:"path"`
	// Wipe allows the pool to erase a foreign signature (partition table, filesystem, RAID
	// or LVM label) found on this disk. Off by default: such a disk is refused untouched.
	Wipe bool `json:"wipe,omitempty"`
	// Spare makes a newly claimed disk a hot spare, used automatically when a disk fails.
	Spare bool `json:"spare,omitempty"`

	// recorded: the entry comes from Config.DisksFile, not the configured list (never
	// claimed blank, never wiped: only a disk carrying a label is taken).
	recorded bool
}

// Config is the configuration of a node's pool.
type Config struct {
	// Name names a new pool (kept in its labels); default "default".
	Name string `json:"name,omitempty"`
	// PoolUUID, when set, selects the pool among disks carrying labels of several pools;
	// disks of other pools are refused. When empty, the disks must agree on one pool.
	PoolUUID string `json:"poolUUID,omitempty"`
	// Disks lists the disks; at least two are needed for a volume.
	Disks []DiskConfig `json:"disks"`
	// DisksFile, when set, is a file where the pool records every disk that AddDisk or
	// ReplaceDisk claimed or took back on a path Disks does not cover; Open takes those
	// disks as listed (never blank: a recorded path whose disk carries no label is refused,
	// never claimed), so that they stay in the pool across restarts. A missing file holds
	// no disk. The plugin sets it to DisksFileName in its --state-dir.
	DisksFile string `json:"disksFile,omitempty"`
	// Alignment of extents in bytes, a power of two >= 64 KiB; default 1 MiB.
	Alignment int64 `json:"alignment,omitempty"`
	// Allocation is the extent placement policy; default first-fit.
	Allocation AllocPolicy `json:"allocation,omitempty"`
	// ChunkSize is the RAID10 chunk size of new volumes in bytes; 0 is the engine's default.
	ChunkSize int64 `json:"chunkSize,omitempty"`
	// RebuildRateMax limits rebuild speed in bytes per second; 0 is the engine's default.
	RebuildRateMax int64 `json:"rebuildRateMax,omitempty"`
	// MemberTimeout is the deadline of one member request of every volume: a member with a
	// request outstanding longer is failed and the request completes from the other copy
	// (raid10.Options.MemberTimeout). 0 is the engine's default
	// (raid10.DefaultMemberTimeout), negative turns it off; a positive value must stay below
	// MaxMemberTimeout. In JSON a duration string ("5s", "1500ms") or a number of seconds.
	MemberTimeout Duration `json:"memberTimeout,omitempty"`
	// Scrub is the schedule of the volumes' scrubs: by default a check every first Sunday
	// of the month in a nightly window (ScrubConfig).
	Scrub ScrubConfig `json:"scrub,omitempty"`

	// OpenDisk, when set, opens every disk path (Disks, DisksFile, AddDisk, ReplaceDisk)
	// instead of the file system: the pool claims, labels and serves the returned member
	// as it would a device of that size (labels through its ReadAt and WriteAt, Flush for
	// their durability, Discard for freed extents), with no lock, no identity, no glob
	// expansion of a path without glob characters. The member is the disk's data path too;
	// the pool closes it with the disk. Nil (the plugin): devices and files. For disks
	// that live elsewhere, such as the in-memory disks of the hollow nodes in test/scale.
	OpenDisk func(path string) (raid10.Member, error) `json:"-"`
}

// Duration is a time.Duration that JSON writes as a duration string ("5s") and reads from a
// duration string or a number of seconds.
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string ("5s", "-1s") or a number of seconds (5, 0.5).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration %s: a duration string such as \"5s\" or a number of seconds", b)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// String is the time.Duration form.
func (d Duration) String() string { return time.Duration(d).String() }

// MemberTimeoutMargin is how far a positive member timeout must stay below the kernel's NBD
// request timeout: after the deadline fails the slow member, the request still has to be
// served from the other copy before the kernel gives up on it (and on the device).
const MemberTimeoutMargin = 2 * time.Second

// MaxMemberTimeout bounds a positive Config.MemberTimeout (exclusive): the kernel NBD request
// timeout that devices are attached with (kernel.DefaultTimeout) less MemberTimeoutMargin.
const MaxMemberTimeout = kernel.DefaultTimeout - MemberTimeoutMargin

// ValidateMemberTimeout checks a member request deadline: 0 (the engine's default) or
// negative (off), or positive and below MaxMemberTimeout.
func ValidateMemberTimeout(d time.Duration) error {
	if d >= MaxMemberTimeout {
		return fmt.Errorf("%w: member timeout %s: must be below %s (the kernel's NBD request timeout %s less %s), or 0 for the default %s, or negative to turn it off",
			ErrInvalidArgument, d, MaxMemberTimeout, kernel.DefaultTimeout, MemberTimeoutMargin, raid10.DefaultMemberTimeout)
	}
	return nil
}

// LoadConfig reads a JSON configuration file.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("pool: read config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%w: config %s: %w", ErrInvalidArgument, path, err)
	}
	return c, nil
}

// withDefaults returns c with defaults filled in.
func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = "default"
	}
	if c.Alignment == 0 {
		c.Alignment = DefaultAlignment
	}
	if c.Allocation == "" {
		c.Allocation = FirstFit
	}
	return c
}

// Validate reports the first invalid field, naming it.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := ValidateName(c.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	if c.PoolUUID != "" {
		if _, err := ParseUUID(c.PoolUUID); err != nil {
			return fmt.Errorf("poolUUID: %w", err)
		}
	}
	if c.Alignment < 64<<10 || c.Alignment&(c.Alignment-1) != 0 || c.Alignment > 1<<30 {
		return fmt.Errorf("%w: alignment %d: must be a power of two from 64 KiB to 1 GiB", ErrInvalidArgument, c.Alignment)
	}
	if c.Allocation != FirstFit && c.Allocation != BestFit {
		return fmt.Errorf("%w: allocation %q: must be %s or %s", ErrInvalidArgument, c.Allocation, FirstFit, BestFit)
	}
	if c.ChunkSize < 0 || c.RebuildRateMax < 0 {
		return fmt.Errorf("%w: chunkSize and rebuildRateMax must not be negative", ErrInvalidArgument)
	}
	if err := ValidateMemberTimeout(time.Duration(c.MemberTimeout)); err != nil {
		return fmt.Errorf("memberTimeout: %w", err)
	}
	if err := c.Scrub.Validate(); err != nil {
		return err
	}
	for i, d := range c.Disks {
		if d.Path == "" {
			return fmt.Errorf("%w: disks[%d].path is empty", ErrInvalidArgument, i)
		}
		if _, err := filepath.Match(d.Path, ""); err != nil {
			return fmt.Errorf("%w: disks[%d].path %q: %w", ErrInvalidArgument, i, d.Path, err)
		}
	}
	return nil
}

// expandDisks resolves globs and drops duplicates (two paths naming the same device, e.g.
// /dev/sdb and its by-id link). The first configuration naming a disk wins.
func expandDisks(disks []DiskConfig) []DiskConfig {
	var out []DiskConfig
	seen := map[string]bool{}
	for _, d := range disks {
		paths := []string{d.Path}
		if hasMeta(d.Path) {
			paths, _ = filepath.Glob(d.Path) // the pattern was validated
			sort.Strings(paths)
		}
		for _, p := range paths {
			key := p
			if r, err := filepath.EvalSymlinks(p); err == nil {
				key = r
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			dc := d
			dc.Path = p
			out = append(out, dc)
		}
	}
	return out
}

func hasMeta(p string) bool {
	for _, c := range p {
		if c == '*' || c == '?' || c == '[' || c == '\\' {
			return true
		}
	}
	return false
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]*$`)

// ValidateName checks a volume or pool name: 1 to 63 bytes of letters, digits, '.', '_'
// and '-', starting with a letter or digit (it is stored in a 64-byte label field and used
// in socket file names).
func ValidateName(name string) error {
	if len(name) == 0 || len(name) > maxNameLen || !nameRE.MatchString(name) {
		return fmt.Errorf("%w: name %q: 1 to %d characters from [a-zA-Z0-9._-], starting with a letter or digit",
			ErrInvalidArgument, name, maxNameLen)
	}
	return nil
}
