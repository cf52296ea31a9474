package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
)

// DefaultMaxVolumesPerNode is what NodeGetInfo reports when no limit is configured. The
// kernel's nbd creates a device for each netlink connect past the module's nbds_max, so the
// bound is the node's memory: a held volume costs the plugin about 2.5 MiB and the kernel
// about 0.9 MiB (make node-scale held 256 on a 4 GiB VM); 64 volumes take about 220 MiB.
const DefaultMaxVolumesPerNode = 64

// VolumeAttacher gives the node service the block device of a volume of this node's pool.
// Its methods return errors wrapping ErrNotFound for a volume the pool does not have;
// anything else maps to Internal.
type VolumeAttacher interface {
	// Attach serves the volume on a block device and returns the device's path
	// (/dev/nbdX). Attaching an attached volume returns its device.
	Attach(ctx context.Context, volumeID string) (string, error)
	// Detach disconnects the volume's device. A volume that is not attached, or that the
	// pool no longer has, is no error.
	Detach(ctx context.Context, volumeID string) error
	// Volume reports the volume's size and health.
	Volume(ctx context.Context, volumeID string) (attach.VolumeState, error)
	// Expand makes the attached device of the volume as large as the volume is now (after
	// the pool grew it), in place under a mounted filesystem, and returns the device's size
	// in bytes. A volume not attached here is an error wrapping ErrFailedPrecondition.
	Expand(ctx context.Context, volumeID string) (int64, error)
	// Device returns the path of the volume's attached device, "" when it is not attached
	// here.
	Device(volumeID string) string
}

// frontendAttacher is a VolumeAttacher that serves a volume over the frontend its
// StorageClass names (the volume context's "frontend").
type frontendAttacher interface {
	// AttachFrontend is Attach over frontend f (attach.FrontendAuto: the node's choice).
	AttachFrontend(ctx context.Context, volumeID string, f attach.Frontend) (string, error)
}

// The node's data path is the attacher of the node service and the local store's guard.
var (
	_ VolumeAttacher   = (*attach.PoolAttacher)(nil)
	_ frontendAttacher = (*attach.PoolAttacher)(nil)
	_ AttachedDevices  = (*attach.PoolAttacher)(nil)
)

// NodeConfig is what a NodeServer is built from. Every side effect comes in here.
type NodeConfig struct {
	// NodeID is this node's name (NodeGetInfo, topology raid10.csi.io/node).
	NodeID string
	// MaxVolumes is reported as max_volumes_per_node (default DefaultMaxVolumesPerNode).
	MaxVolumes int64
	// Attacher gives volumes' block devices.
	Attacher VolumeAttacher
	// Mounter mounts and unmounts (mount.New("") in production, a FakeMounter in tests).
	Mounter mount.Interface
	// Exec runs blkid, mkfs, fsck and the resize tools (utilexec.New() in production).
	Exec utilexec.Interface
	// Mounts finds the mounts that still use a device before NodeUnstageVolume detaches it;
	// nil: the kernel's mount table (MountInfo, /proc/self/mountinfo).
	Mounts MountTable
	// Pool answers the health calls (health_node.go); nil: GET_VOLUME_HEALTH and
	// GET_STORAGE_HEALTH are not advertised.
	Pool PoolHealth
	// Crypt tunes the key derivation of the LUKS2 headers of encrypted volumes
	// (node_crypt.go); zero: cryptsetup's defaults.
	Crypt crypt.Options
}

// NodeServer is the CSI node service: it attaches a volume of the local pool over NBD,
// formats a blank device, mounts it at the staging path and bind-mounts it into pods.
// Its methods return the sentinels of errors.go; the interceptor maps them to codes.
type NodeServer struct {
	csi.UnimplementedNodeServer

	nodeID     string
	maxVolumes int64
	attacher   VolumeAttacher
	mounter    *mount.SafeFormatAndMount
	mounts     MountTable
	resizer    *mount.ResizeFs
	locks      *VolumeLocks
	pool       PoolHealth // nil: no health calls
	cryptOpts  crypt.Options
}

var _ csi.NodeServer = (*NodeServer)(nil)

// NewNodeServer builds a node service, reporting the first missing field of cfg.
func NewNodeServer(cfg NodeConfig) (*NodeServer, error) {
	switch {
	case cfg.NodeID == "":
		return nil, fmt.Errorf("node ID: must be set: %w", ErrInvalidArgument)
	case cfg.Attacher == nil:
		return nil, fmt.Errorf("node service needs a VolumeAttacher: %w", ErrInvalidArgument)
	case cfg.Mounter == nil || cfg.Exec == nil:
		return nil, fmt.Errorf("node service needs a mounter and an exec: %w", ErrInvalidArgument)
	}
	if cfg.MaxVolumes <= 0 {
		cfg.MaxVolumes = DefaultMaxVolumesPerNode
	}
	if cfg.Mounts == nil {
		cfg.Mounts = MountInfo{}
	}
	return &NodeServer{
		nodeID:     cfg.NodeID,
		maxVolumes: cfg.MaxVolumes,
		attacher:   cfg.Attacher,
		mounter:    mount.NewSafeFormatAndMount(cfg.Mounter, cfg.Exec),
		mounts:     cfg.Mounts,
		resizer:    mount.NewResizeFs(cfg.Exec),
		locks:      &VolumeLocks{},
		pool:       cfg.Pool,
		cryptOpts:  cfg.Crypt,
	}, nil
}

// field is one string field of a request, named as in the CSI spec.
type field struct{ name, value string }

// requireFields reports the first empty field as an error wrapping ErrInvalidArgument that
// names it: the one required-field check of every node RPC.
func requireFields(fields ...field) error {
	for _, f := range fields {
		if f.value == "" {
			return fmt.Errorf("%s: must not be empty: %w", f.name, ErrInvalidArgument)
		}
	}
	return nil
}

// nodeShape validates the one capability of a node request.
func nodeShape(c *csi.VolumeCapability) (volumeShape, *csi.VolumeCapability_MountVolume, error) {
	if c == nil {
		return volumeShape{}, nil, fmt.Errorf("volume_capability: must be set: %w", ErrInvalidArgument)
	}
	shape, err := parseCapabilities([]*csi.VolumeCapability{c})
	if err != nil {
		return shape, nil, err
	}
	return shape, c.GetMount(), nil
}

// NodeStageVolume attaches the volume over NBD and, for Filesystem, formats the device if it
// is blank and mounts it at the staging path. A repeated call finds everything done.
func (n *NodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireFields(field{"volume_id", id}, field{"staging_target_path", staging}); err != nil {
		return nil, err
	}
	shape, mnt, err := nodeShape(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if err := n.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer n.locks.Release(id)

	var dev string
	if fa, ok := n.attacher.(frontendAttacher); ok {
		f, ferr := attach.ParseFrontend(req.GetVolumeContext()[ParamFrontend])
		if ferr != nil {
			return nil, fmt.Errorf("volume_context: %w", ferr)
		}
		dev, err = fa.AttachFrontend(ctx, id, f)
	} else {
		dev, err = n.attacher.Attach(ctx, id)
	}
	if err != nil {
		return nil, fmt.Errorf("attach volume %q: %w", id, err)
	}
	if dev, err = n.openEncrypted(ctx, id, dev, req.GetVolumeContext(), req.GetSecrets()); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	if shape.mode == v1alpha1.VolumeModeBlock {
		logger.Info("Volume staged as a block device", "device", dev)
		return &csi.NodeStageVolumeResponse{}, nil
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, fmt.Errorf("create staging path %s: %w", staging, err)
	}
	notMnt, err := n.mounter.IsLikelyNotMountPoint(staging)
	if err != nil {
		return nil, fmt.Errorf("check staging path %s: %w", staging, err)
	}
	if !notMnt {
		logger.V(4).Info("Volume already staged", "stagingPath", staging)
		return &csi.NodeStageVolumeResponse{}, nil
	}
	fsType := string(shape.fsType)
	existing, err := n.mounter.GetDiskFormat(dev)
	if err != nil {
		return nil, fmt.Errorf("blkid %s: %w", dev, err)
	}
	if existing != "" && mnt.GetFsType() == "" {
		fsType = existing // no type asked for: keep the filesystem the volume has
	}
	if existing != "" && existing != fsType {
		return nil, fmt.Errorf("volume %q: device %s holds %s, %s was asked for: %w", id, dev, existing, fsType, ErrFailedPrecondition)
	}
	// FormatAndMount runs mkfs only when blkid finds the device blank.
	if err := n.mounter.FormatAndMount(dev, staging, fsType, stageMountOptions(fsType, mnt.GetMountFlags())); err != nil {
		return nil, fmt.Errorf("format and mount %s at %s: %w", dev, staging, err)
	}
	if existing != "" {
		// A volume restored from a snapshot, or cloned, into a larger claim has its source's
		// filesystem on a larger device: it grows to the device here, as no NodeExpandVolume
		// follows a create.
		grow, err := n.resizer.NeedResize(dev, staging)
		if err != nil {
			return nil, fmt.Errorf("compare the filesystem on %s with its device: %w", dev, err)
		}
		if grow {
			if _, err := n.resizer.Resize(dev, staging); err != nil {
				return nil, fmt.Errorf("grow the filesystem on %s to its device: %w", dev, err)
			}
			logger.Info("Filesystem grown to its device at stage", "device", dev, "stagingPath", staging, "fsType", fsType)
		}
	}
	logger.Info("Volume staged", "device", dev, "stagingPath", staging, "fsType", fsType, "formatted", existing == "")
	return &csi.NodeStageVolumeResponse{}, nil
}

// stageMountOptions are the options a staging mount of fsType gets: the claim's mount flags,
// and for xfs "nouuid". A volume restored from a snapshot or cloned from another carries its
// source's filesystem UUID, and the kernel refuses to mount an xfs whose UUID a mounted one
// has ("Filesystem has duplicate UUID"): without it a pod could not use a clone or a restore
// beside its source on the same node, and a volume lives on one node. ext4 has no such check.
func stageMountOptions(fsType string, flags []string) []string {
	opts := slices.Clone(flags)
	if fsType == "xfs" && !slices.Contains(opts, "nouuid") {
		opts = append(opts, "nouuid")
	}
	return opts
}

// NodeUnstageVolume unmounts the staging path (missing or not mounted is success) and
// detaches the volume's NBD device. While any other mount of the device remains (a publish
// bind, a Block bind of the device node, a mount made by hand), it is refused with
// FailedPrecondition naming that mount: detaching would fail its I/O. The device is looked
// up in the mount table, not through the staging path, which may have been unmounted behind
// the driver's back while a pod's bind of it lives on.
func (n *NodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireFields(field{"volume_id", id}, field{"staging_target_path", staging}); err != nil {
		return nil, err
	}
	if err := n.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer n.locks.Release(id)
	dev := n.attacher.Device(id)
	if dev == "" { // not attached by this process: still, never unmount under a pod's bind
		if notMnt, err := n.mounter.IsLikelyNotMountPoint(staging); err == nil && !notMnt {
			if dev, _, err = mount.GetDeviceNameFromMount(n.mounter, staging); err != nil {
				return nil, fmt.Errorf("device of %s: %w", staging, err)
			}
		}
	}
	dev = n.stagedDevice(id, dev) // the LUKS mapping of an encrypted volume
	if dev != "" {
		mps, err := n.mounts.MountsOf(dev)
		if err != nil {
			return nil, fmt.Errorf("volume %q: mounts of %s: %w", id, dev, err)
		}
		var others []string
		for _, mp := range mps {
			if filepath.Clean(mp) != filepath.Clean(staging) {
				others = append(others, mp)
			}
		}
		if len(others) > 0 {
			return nil, fmt.Errorf("volume %q: %s is still mounted at %s (%d mount(s) besides the staging path; unpublish first): %w",
				id, dev, strings.Join(others, ", "), len(others), ErrFailedPrecondition)
		}
	}
	if err := mount.CleanupMountPoint(staging, n.mounter, true); err != nil {
		return nil, fmt.Errorf("unmount %s: %w", staging, err)
	}
	if err := n.closeEncrypted(ctx, id); err != nil {
		return nil, err
	}
	if err := n.attacher.Detach(ctx, id); err != nil {
		return nil, fmt.Errorf("detach volume %q: %w", id, err)
	}
	klog.FromContext(ctx).Info("Volume unstaged", "stagingPath", staging, "device", dev)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staging path onto the target directory, or for Block
// the device node onto a file at the target path; readonly makes the bind read-only.
func (n *NodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, staging, target := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetTargetPath()
	// staging_target_path is required: the plugin advertises STAGE_UNSTAGE_VOLUME.
	if err := requireFields(field{"volume_id", id}, field{"staging_target_path", staging}, field{"target_path", target}); err != nil {
		return nil, err
	}
	shape, mnt, err := nodeShape(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if err := n.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer n.locks.Release(id)

	opts := []string{"bind"}
	if req.GetReadonly() {
		opts = append(opts, "ro")
	}
	var source string
	if shape.mode == v1alpha1.VolumeModeBlock {
		// Attach is idempotent: it returns the device NodeStageVolume attached.
		if source, err = n.attacher.Attach(ctx, id); err != nil {
			return nil, fmt.Errorf("device of volume %q: %w", id, err)
		}
		if source, err = n.publishedDevice(id, source, req.GetVolumeContext()); err != nil {
			return nil, err
		}
		if err := makeFile(target); err != nil {
			return nil, err
		}
	} else {
		notMnt, err := n.mounter.IsLikelyNotMountPoint(staging)
		if errors.Is(err, os.ErrNotExist) || (err == nil && notMnt) {
			return nil, fmt.Errorf("staging_target_path %s: volume %q is not staged: %w", staging, id, ErrFailedPrecondition)
		}
		if err != nil {
			return nil, fmt.Errorf("check staging path %s: %w", staging, err)
		}
		source = staging
		opts = append(opts, mnt.GetMountFlags()...)
		if err := os.MkdirAll(target, 0o750); err != nil {
			return nil, fmt.Errorf("create target path %s: %w", target, err)
		}
	}
	notMnt, err := n.mounter.IsLikelyNotMountPoint(target)
	if err != nil {
		return nil, fmt.Errorf("check target path %s: %w", target, err)
	}
	if !notMnt {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := n.mounter.Mount(source, target, "", opts); err != nil {
		return nil, fmt.Errorf("bind %s onto %s: %w", source, target, err)
	}
	klog.FromContext(ctx).Info("Volume published", "source", source, "targetPath", target, "readonly", req.GetReadonly())
	return &csi.NodePublishVolumeResponse{}, nil
}

// makeFile creates an empty file at path (and its directory) for a block bind mount.
func makeFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("create directory of %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return fmt.Errorf("create target file %s: %w", path, err)
	}
	return f.Close()
}

// NodeUnpublishVolume unmounts the target path and removes it; missing or not mounted is
// success.
func (n *NodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := requireFields(field{"volume_id", id}, field{"target_path", target}); err != nil {
		return nil, err
	}
	if err := n.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer n.locks.Release(id)
	if err := mount.CleanupMountPoint(target, n.mounter, true); err != nil {
		return nil, fmt.Errorf("unmount %s: %w", target, err)
	}
	klog.FromContext(ctx).Info("Volume unpublished", "targetPath", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats reports bytes and inodes of a filesystem volume (statfs of the path), or
// the size of a block volume. The volume's health is NodeGetVolumeHealth's: CSI 1.13 took
// VolumeCondition out of this answer.
func (n *NodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireFields(field{"volume_id", id}, field{"volume_path", path}); err != nil {
		return nil, err
	}
	vs, err := n.attacher.Volume(ctx, id)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("volume_path %s: %w", path, ErrNotFound)
		}
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		return &csi.NodeGetVolumeStatsResponse{
			Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: vs.SizeBytes}},
		}, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := fs.Bsize
	return &csi.NodeGetVolumeStatsResponse{
		Usage: []*csi.VolumeUsage{
			{Unit: csi.VolumeUsage_BYTES, Total: int64(fs.Blocks) * bs, Available: int64(fs.Bavail) * bs,
				Used: int64(fs.Blocks-fs.Bfree) * bs},
			{Unit: csi.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree),
				Used: int64(fs.Files - fs.Ffree)},
		},
	}, nil
}

// NodeExpandVolume makes the volume's device learn the size the pool grew the volume to
// (the attacher resizes /dev/nbdX in place), then, for Filesystem, grows the mounted
// filesystem to the device's size online (resize2fs for ext4, xfs_growfs for xfs). It reports
// the device's size: for Block that is all there is to do, which is why the controller asks
// for node expansion for Block volumes too.
func (n *NodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireFields(field{"volume_id", id}, field{"volume_path", path}); err != nil {
		return nil, err
	}
	block := false
	if c := req.GetVolumeCapability(); c != nil {
		shape, _, err := nodeShape(c)
		if err != nil {
			return nil, err
		}
		block = shape.mode == v1alpha1.VolumeModeBlock
	}
	if err := n.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer n.locks.Release(id)
	if _, err := n.attacher.Volume(ctx, id); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("volume_path %s: %w", path, ErrNotFound)
		}
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if req.GetVolumeCapability() == nil {
		block = st.Mode&unix.S_IFMT == unix.S_IFBLK
	}
	size, err := n.attacher.Expand(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("grow the device of volume %q: %w", id, err)
	}
	if err := n.resizeEncrypted(ctx, id); err != nil {
		return nil, err
	}
	if want := req.GetCapacityRange().GetRequiredBytes(); want > size {
		return nil, fmt.Errorf("volume %q: the device has %d bytes, %d required: the node agent has not grown the array yet: %w",
			id, size, want, ErrNotReady)
	}
	logger := klog.FromContext(ctx)
	if block {
		logger.Info("Block volume expanded", "volumePath", path, "sizeBytes", size)
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	mountPath := path
	if s := req.GetStagingTargetPath(); s != "" {
		mountPath = s
	}
	dev, _, err := mount.GetDeviceNameFromMount(n.mounter, mountPath)
	if err != nil {
		return nil, fmt.Errorf("device of %s: %w", mountPath, err)
	}
	if dev == "" {
		return nil, fmt.Errorf("volume_path %s: not a mounted volume: %w", mountPath, ErrFailedPrecondition)
	}
	if _, err := n.resizer.Resize(dev, mountPath); err != nil {
		return nil, fmt.Errorf("grow filesystem on %s: %w", dev, err)
	}
	logger.Info("Filesystem grown", "device", dev, "path", mountPath, "sizeBytes", size)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// NodeGetCapabilities advertises staging, expansion and volume stats, and with a pool the
// volume and storage health calls.
func (n *NodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	types := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	}
	if n.pool != nil {
		types = append(types, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH, csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH)
	}
	for _, t := range types {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo reports the node ID, the topology segment raid10.csi.io/node=<node> and the
// maximum number of volumes.
func (n *NodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             n.nodeID,
		MaxVolumesPerNode:  n.maxVolumes,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: n.nodeID}},
	}, nil
}

// WithNodeService sets the node service (node and all modes).
func WithNodeService(n *NodeServer) Option { return func(d *Driver) { d.node = n } }
