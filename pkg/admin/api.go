package admin

import (
	"context"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// API is what the local commands need of a node's pool.
type API interface {
	// Status snapshots the pool.
	Status(ctx context.Context) (pool.Status, error)
	// CreateVolume creates (or returns the same) volume.
	CreateVolume(ctx context.Context, r CreateRequest) (pool.VolumeInfo, error)
	// DeleteVolume deletes a volume; a missing one is success.
	DeleteVolume(ctx context.Context, name string) error
	// ExpandVolume grows a volume in place.
	ExpandVolume(ctx context.Context, name string, size uint64) (pool.VolumeInfo, error)
	// FailDisk marks a disk failed.
	FailDisk(ctx context.Context, ref string) error
	// ReplaceDisk replaces a failed or missing disk.
	ReplaceDisk(ctx context.Context, ref string, with pool.DiskConfig) (pool.DiskInfo, error)
	// AddDisk offers a disk to the pool.
	AddDisk(ctx context.Context, dc pool.DiskConfig) (pool.DiskInfo, error)
	// ReaddDisk puts a failed disk back.
	ReaddDisk(ctx context.Context, ref string) (pool.DiskInfo, error)
	// StartScrub starts a scrub of a volume in the background (pool.StartScrub).
	StartScrub(ctx context.Context, name string, kind pool.ScrubKind) (pool.ScrubInfo, error)
	// StopScrub pauses a volume's running scrub (pool.StopScrub).
	StopScrub(ctx context.Context, name string) (pool.ScrubInfo, error)
	// Close releases the API.
	Close() error
}

// CreateRequest asks for a volume.
type CreateRequest struct {
	Name    string `json:"name"`
	Size    uint64 `json:"size"`
	Members int    `json:"members,omitempty"`
}

// DiskRequest names a disk or a volume and what to do with it.
type DiskRequest struct {
	Ref  string          `json:"ref,omitempty"`
	Disk pool.DiskConfig `json:"disk"`
	Size uint64          `json:"size,omitempty"`
	Name string          `json:"name,omitempty"`
	// Kind is the scrub kind of scrubs/start.
	Kind pool.ScrubKind `json:"kind,omitempty"`
}

// Direct is the pool opened in the caller's process.
type Direct struct{ P *pool.Pool }

var _ API = Direct{}

// Status implements API.
func (d Direct) Status(context.Context) (pool.Status, error) { return d.P.Status(), nil }

// CreateVolume implements API.
func (d Direct) CreateVolume(_ context.Context, r CreateRequest) (pool.VolumeInfo, error) {
	return d.P.CreateVolume(r.Name, r.Size, pool.CreateOptions{Members: r.Members})
}

// DeleteVolume implements API.
func (d Direct) DeleteVolume(_ context.Context, name string) error { return d.P.DeleteVolume(name) }

// ExpandVolume implements API.
func (d Direct) ExpandVolume(_ context.Context, name string, size uint64) (pool.VolumeInfo, error) {
	return d.P.ExpandVolume(name, size)
}

// FailDisk implements API.
func (d Direct) FailDisk(_ context.Context, ref string) error { return d.P.FailDisk(ref) }

// ReplaceDisk implements API.
func (d Direct) ReplaceDisk(_ context.Context, ref string, with pool.DiskConfig) (pool.DiskInfo, error) {
	return d.P.ReplaceDisk(ref, with)
}

// AddDisk implements API.
func (d Direct) AddDisk(_ context.Context, dc pool.DiskConfig) (pool.DiskInfo, error) {
	return d.P.AddDisk(dc)
}

// ReaddDisk implements API.
func (d Direct) ReaddDisk(_ context.Context, ref string) (pool.DiskInfo, error) {
	return d.P.ReaddDisk(ref)
}

// StartScrub implements API.
func (d Direct) StartScrub(_ context.Context, name string, kind pool.ScrubKind) (pool.ScrubInfo, error) {
	return d.P.StartScrub(name, kind)
}

// StopScrub implements API.
func (d Direct) StopScrub(_ context.Context, name string) (pool.ScrubInfo, error) {
	return d.P.StopScrub(name)
}

// Close closes the pool.
func (d Direct) Close() error { return d.P.Close() }
