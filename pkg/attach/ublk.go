package attach

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/ublk"
)

// UblkStateFile is the name of the ublk device records in the node's state directory.
const UblkStateFile = "ublk-state.json"

// ublkRecords maps each volume served over ublk to its device number, in a JSON file
// ({"devices":{"<volumeID>":N}}) written atomically (temporary file, fsync, rename), so a
// restarted plugin recovers its devices and deletes the ones nobody owns.
type ublkRecords struct {
	path string

	mu      sync.Mutex
	Devices map[string]int `json:"devices"`
}

func openUblkRecords(path string) (*ublkRecords, error) {
	r := &ublkRecords{path: path, Devices: map[string]int{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ublk records: %w", err)
	}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("ublk records %s: %w", path, err)
	}
	if r.Devices == nil {
		r.Devices = map[string]int{}
	}
	return r, nil
}

func (r *ublkRecords) get(volumeID string) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.Devices[volumeID]
	return id, ok
}

func (r *ublkRecords) volumes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for v := range r.Devices {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

func (r *ublkRecords) set(volumeID string, id int, present bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if present {
		r.Devices[volumeID] = id
	} else {
		delete(r.Devices, volumeID)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := r.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("ublk records: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return fmt.Errorf("ublk records: %w", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("ublk records: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("ublk records: %w", err)
	}
	if err := os.Rename(tmp, r.path); err != nil {
		return fmt.Errorf("ublk records: %w", err)
	}
	return nil
}

// EnableUblk sets the frontend a volume gets when its StorageClass does not name one
// (--frontend, resolved by ResolveFrontend) and where ublk devices are recorded (statePath,
// in the state directory), and asks the kernel its ublk features once (Frontend reports
// them, expandUblk needs UPDATE_SIZE). Where the kernel has ublk it then recovers every recorded device
// a predecessor left (the kernel kept their I/O queued) and deletes every device of ours
// that no record names, or whose volume the pool no longer has (orphans of a crash between
// adding a device and recording it, or of a volume deleted meanwhile; one that something
// holds open is stopped and left for the next start after UblkOrphanDeleteTimeout). A device
// that cannot be recovered is logged and left for its NodeStageVolume retry.
func (a *PoolAttacher) EnableUblk(ctx context.Context, def Frontend, statePath string) error {
	rec, err := openUblkRecords(statePath)
	if err != nil {
		return err
	}
	feat, ferr := kernelUblkFeatures(ctx)
	a.mu.Lock()
	a.frontend, a.ublkRec, a.ublkFeat = def, rec, feat
	a.mu.Unlock()
	if ferr == nil {
		klog.InfoS("Kernel ublk features", "features", feat.String(), "reported", feat.Report(), "missing", feat.Missing(ublk.Required).String())
	}
	if ublk.Available() != nil {
		if n := len(rec.volumes()); n > 0 {
			klog.InfoS("ublk devices recorded but the kernel has no ublk now", "devices", n)
		}
		return nil
	}
	for _, vol := range rec.volumes() {
		if _, err := a.AttachFrontend(ctx, vol, FrontendUblk); err != nil {
			klog.ErrorS(err, "Recovering a ublk device", "volumeID", vol)
		}
	}
	a.deleteUblkOrphans(ctx)
	return nil
}

// UblkOrphanDeleteTimeout bounds the deletion of one orphaned ublk device at start.
const UblkOrphanDeleteTimeout = 5 * time.Second

// deleteUblkOrphans deletes the ublk devices of this driver that no volume served here owns.
func (a *PoolAttacher) deleteUblkOrphans(ctx context.Context) {
	ids, err := ublk.List()
	if err != nil {
		klog.ErrorS(err, "Listing ublk devices")
		return
	}
	a.mu.Lock()
	owned := map[int]bool{}
	for _, s := range a.vols {
		if s.ub != nil {
			owned[s.ub.ID()] = true
		}
	}
	a.mu.Unlock()
	for _, id := range ids {
		if owned[id] {
			continue
		}
		info, err := ublk.GetInfo(ctx, id)
		if err != nil || !info.Ours() {
			continue // gone meanwhile, or another server's
		}
		// The kernel's DEL_DEV waits until nothing holds the device open: an orphan that
		// something still has open (a mount left behind) would keep the plugin from ever
		// serving. Bounded, it is stopped (its I/O fails) and left for the next start.
		dctx, cancel := context.WithTimeout(ctx, UblkOrphanDeleteTimeout)
		err = ublk.Delete(dctx, id)
		cancel()
		if err != nil {
			klog.ErrorS(err, "Deleting an orphaned ublk device: left for the next start (something holds it open?)", "device", ublk.BlockPath(id), "timeout", UblkOrphanDeleteTimeout)
			continue
		}
		klog.InfoS("Deleted an orphaned ublk device", "device", ublk.BlockPath(id), "state", info.State)
	}
}

// attachUblk serves the volume on a ublk device: the recorded one recovered, else a new one.
// Called with a.mu held.
func (a *PoolAttacher) attachUblk(ctx context.Context, volumeID string) (*served, error) {
	if a.ublkRec == nil {
		return nil, fmt.Errorf("frontend ublk: not enabled on this node (EnableUblk): %w", ErrFrontendUnavailable)
	}
	if err := ublk.Available(); err != nil {
		return nil, fmt.Errorf("frontend ublk: %w: %w", err, ErrFrontendUnavailable)
	}
	arr, err := a.pool.Array(volumeID)
	if err != nil {
		return nil, err
	}
	if id, ok := a.ublkRec.get(volumeID); ok {
		d, err := ublk.Recover(ctx, id, arr)
		if err == nil {
			return &served{ub: d}, nil
		}
		if !errors.Is(err, ublk.ErrNotRecoverable) && !errors.Is(err, ublk.ErrNotOurs) && ublkExists(ctx, id) {
			return nil, fmt.Errorf("recover %s: %w", ublk.BlockPath(id), err)
		}
		// Gone, stopped or not ours: the record is stale; a new device replaces it.
		klog.InfoS("Recorded ublk device not recoverable, adding a new one", "volumeID", volumeID, "device", ublk.BlockPath(id), "err", err)
		if errors.Is(err, ublk.ErrNotRecoverable) {
			_ = ublk.Delete(ctx, id)
		}
	}
	d, err := ublk.Create(ctx, arr, ublk.Options{})
	if err != nil {
		return nil, err
	}
	if err := a.ublkRec.set(volumeID, d.ID(), true); err != nil {
		_ = d.Delete(context.WithoutCancel(ctx))
		return nil, err
	}
	return &served{ub: d}, nil
}

func ublkExists(ctx context.Context, id int) bool {
	_, err := ublk.GetInfo(ctx, id)
	return err == nil
}

// detachUblk deletes the volume's ublk device (served here or only recorded) and its record.
// Called with a.mu held.
func (a *PoolAttacher) detachUblk(ctx context.Context, volumeID string, s *served) error {
	if s != nil && s.ub != nil {
		if err := s.ub.Delete(ctx); err != nil {
			return err
		}
	} else if id, ok := a.ublkRec.get(volumeID); ok {
		if err := ublk.Delete(ctx, id); err != nil {
			return err
		}
	} else {
		return nil
	}
	return a.ublkRec.set(volumeID, 0, false)
}

// expandUblk makes the volume's ublk device as large as its grown array while it is served
// (UPDATE_SIZE, Linux 6.16+) and returns the device's size. A kernel without UPDATE_SIZE
// keeps the device at its size until the volume is staged again: ErrCannotGrow, naming
// why. Called with a.mu held.
func (a *PoolAttacher) expandUblk(ctx context.Context, volumeID string, d *ublk.Device) (int64, error) {
	have, err := d.Size()
	if err != nil {
		return 0, err
	}
	arr, err := a.pool.Array(volumeID)
	if err != nil {
		return 0, err
	}
	want := arr.Size()
	if want <= have {
		return have, nil
	}
	if err := d.Resize(ctx, want); err != nil {
		if errors.Is(err, ublk.ErrNoResize) {
			return 0, fmt.Errorf("volume %q grew to %d bytes, its ublk device %s stays at %d until the volume is staged again (online expansion over ublk needs UPDATE_SIZE, Linux 6.16+; the nbd frontend has it everywhere): %w: %w",
				volumeID, want, d.Path(), have, err, ErrCannotGrow)
		}
		return 0, err
	}
	return d.Size()
}

// Frontend names how the volume is served here, for its status: "nbd", or "ublk" followed
// by the newer ublk features of the kernel in parentheses (ublk.Flags.Report) and whether
// the device is zero-copy (ublkFrontend); "" when it is not attached by this process.
func (a *PoolAttacher) Frontend(volumeID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.vols[volumeID]
	switch {
	case s == nil:
		return ""
	case s.ub == nil:
		return string(FrontendNBD)
	}
	return ublkFrontend(a.ublkFeat, s.ub.ZeroCopy())
}

// ublkFrontend is a ublk volume's frontend for its status: "ublk", the kernel's newer
// features in parentheses, and "; zero copy" inside them when the device's data moves with no
// copy (ublk.Device.ZeroCopy), e.g. "ublk (SUPPORT_ZERO_COPY, UPDATE_SIZE, AUTO_BUF_REG,
// PER_IO_DAEMON, BATCH_IO; zero copy)".
func ublkFrontend(feat ublk.Flags, zeroCopy bool) string {
	r := feat.Report()
	if zeroCopy {
		r += "; zero copy"
	}
	if r == "" {
		return string(FrontendUblk)
	}
	return string(FrontendUblk) + " (" + r + ")"
}
