package driver

import (
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/attach"
)

// StorageClass parameters (docs/parameters.md is the table for users).
const (
	// ParamMembers is the number of member disks: even, 2 to 32. Default 4.
	ParamMembers = "members"
	// ParamChunkSize is the stripe chunk size as a quantity (512Ki): a power of two from 4Ki
	// to 16Mi. Default 512Ki.
	ParamChunkSize = "chunkSize"
	// ParamFrontend is how the node serves the volume's block device: auto, nbd or ublk
	// (attach.Frontend). It reaches the node in the volume context.
	ParamFrontend = "frontend"
	// ParamEncrypted is "true" for a volume encrypted at rest (dm-crypt, LUKS2; the key from
	// the node-stage Secret, node_crypt.go) or "false" (default). It reaches the node in the
	// volume context.
	ParamEncrypted = "encrypted"

	// Keys that external-provisioner's --extra-create-metadata adds; recorded as annotations.
	paramPVCName      = "csi.storage.k8s.io/pvc/name"
	paramPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	paramPVName       = "csi.storage.k8s.io/pv/name"
)

// Defaults and limits of the layout.
const (
	DefaultMembers        = 4
	MaxMembers            = 32
	DefaultChunkSizeBytes = 512 << 10
	MinChunkSizeBytes     = 4 << 10
	MaxChunkSizeBytes     = 16 << 20
	// SizeAlignment is the granularity of volume sizes: every size is rounded up to it.
	SizeAlignment = 1 << 20
	// DefaultVolumeSize is the size of a volume whose capacity range says nothing.
	DefaultVolumeSize = 1 << 30
)

// volumeParams are the validated StorageClass parameters of a CreateVolume or GetCapacity.
type volumeParams struct {
	layout       v1alpha1.Layout
	pvcName      string
	pvcNamespace string
	pvName       string
	frontend     attach.Frontend               // "" when the StorageClass does not say: the node's --frontend
	maxSnapshots string                        // ParamMaxSnapshots as validated, "" when unset
	limits       v1alpha1.VolumeLimits         // the QoS limit parameters (params_limits.go); 0: none
	rates        v1alpha1.VolumeRates          // the rate parameters (params_rates.go); 0: the node's
	scrub        *v1alpha1.VolumeScrubSchedule // the scrub schedule parameters (params_scrub.go); nil: the node's
	encrypted    bool                          // ParamEncrypted
}

// parseParams validates StorageClass parameters. An unknown or invalid one is an error
// wrapping ErrInvalidArgument that names it.
func parseParams(in map[string]string) (volumeParams, error) {
	p := volumeParams{layout: v1alpha1.Layout{Members: DefaultMembers, ChunkSizeBytes: DefaultChunkSizeBytes}}
	for _, k := range slices.Sorted(maps.Keys(in)) { // the first bad parameter, deterministically
		v := in[k]
		switch k {
		case ParamMembers:
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 2 || n > MaxMembers || n%2 != 0 {
				return p, fmt.Errorf("parameter %s=%q: must be an even number from 2 to %d: %w", k, v, MaxMembers, ErrInvalidArgument)
			}
			p.layout.Members = int32(n)
		case ParamChunkSize:
			q, err := resource.ParseQuantity(v)
			n, ok := q.AsInt64()
			if err != nil || !ok || n < MinChunkSizeBytes || n > MaxChunkSizeBytes || bits.OnesCount64(uint64(n)) != 1 {
				return p, fmt.Errorf("parameter %s=%q: must be a power of two from 4Ki to 16Mi: %w", k, v, ErrInvalidArgument)
			}
			p.layout.ChunkSizeBytes = n
		case ParamFrontend:
			f, err := attach.ParseFrontend(v)
			if err != nil {
				return p, fmt.Errorf("parameter %s: %w: %w", k, err, ErrInvalidArgument)
			}
			p.frontend = f
		case ParamMaxSnapshots:
			if _, err := parseMaxSnapshots(v); err != nil {
				return p, fmt.Errorf("parameter %s: %w", k, err)
			}
			p.maxSnapshots = v
		case ParamEncrypted:
			b, err := parseEncrypted(v)
			if err != nil {
				return p, err
			}
			p.encrypted = b
		case paramPVCName:
			p.pvcName = v
		case paramPVCNamespace:
			p.pvcNamespace = v
		case paramPVName:
			p.pvName = v
		default:
			known, err := setLimit(&p.limits, k, v)
			if err == nil && !known {
				known, err = setRate(&p.rates, k, v)
			}
			if err == nil && !known {
				known, err = setScrub(&v1alpha1.VolumeScrubSchedule{}, k, v) // checked here, merged below
			}
			if err != nil {
				return p, err
			}
			if !known {
				return p, fmt.Errorf("parameter %q: unknown (known: %s, %s, %s, %s, %s, %s): %w", k, ParamMembers, ParamChunkSize, ParamFrontend, ParamEncrypted, ParamMaxSnapshots, limitParamNames+", "+rateParamNames+", "+scrubParamNames, ErrInvalidArgument)
			}
		}
	}
	var err error
	p.scrub, err = parseMutableScrub(in, nil) // the scrub keys together: scrubStart needs scrubSchedule
	return p, err
}

// volumeShape is what a set of volume capabilities asks for.
type volumeShape struct {
	mode   v1alpha1.VolumeMode
	fsType v1alpha1.FSType // empty for Block
}

// supportedAccessModes are the single-node modes: ReadWriteOnce maps to SINGLE_NODE_WRITER (or
// SINGLE_NODE_MULTI_WRITER, which the controller advertises) and ReadWriteOncePod to
// SINGLE_NODE_SINGLE_WRITER.
var supportedAccessModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:        true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  true,
}

// parseCapabilities validates volume capabilities and returns the shape they ask for. They
// must not be empty and must agree on Block versus Filesystem and on the filesystem type.
func parseCapabilities(caps []*csi.VolumeCapability) (volumeShape, error) {
	var shape volumeShape
	if len(caps) == 0 {
		return shape, fmt.Errorf("volume_capabilities: must not be empty: %w", ErrInvalidArgument)
	}
	for i, c := range caps {
		if c == nil {
			return shape, fmt.Errorf("volume_capabilities[%d]: must not be null: %w", i, ErrInvalidArgument)
		}
		am := c.GetAccessMode()
		if am == nil {
			return shape, fmt.Errorf("volume_capabilities[%d].access_mode: must be set: %w", i, ErrInvalidArgument)
		}
		if !supportedAccessModes[am.GetMode()] {
			return shape, fmt.Errorf("volume_capabilities[%d].access_mode %s: only single-node modes (ReadWriteOnce, ReadWriteOncePod) are supported: %w", i, am.GetMode(), ErrInvalidArgument)
		}
		var s volumeShape
		switch t := c.GetAccessType().(type) {
		case *csi.VolumeCapability_Block:
			s.mode = v1alpha1.VolumeModeBlock
		case *csi.VolumeCapability_Mount:
			s.mode = v1alpha1.VolumeModeFilesystem
			switch fs := t.Mount.GetFsType(); fs {
			case "", string(v1alpha1.FSTypeExt4):
				s.fsType = v1alpha1.FSTypeExt4
			case string(v1alpha1.FSTypeXFS):
				s.fsType = v1alpha1.FSTypeXFS
			default:
				return shape, fmt.Errorf("volume_capabilities[%d].mount.fs_type %q: must be ext4 or xfs: %w", i, fs, ErrInvalidArgument)
			}
		default:
			return shape, fmt.Errorf("volume_capabilities[%d].access_type: must be block or mount: %w", i, ErrInvalidArgument)
		}
		if i > 0 && s != shape {
			return shape, fmt.Errorf("volume_capabilities[%d]: asks for %s %s, an earlier one for %s %s: %w", i, s.mode, s.fsType, shape.mode, shape.fsType, ErrInvalidArgument)
		}
		shape = s
	}
	return shape, nil
}

// requestedSize turns a capacity range into a size: required (or DefaultVolumeSize when
// neither bound is set, capped by the limit) rounded up to SizeAlignment; an error wrapping
// ErrOutOfRange when the rounded size exceeds the limit or the range is inverted.
func requestedSize(r *csi.CapacityRange) (int64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, fmt.Errorf("capacity_range: negative bytes: %w", ErrOutOfRange)
	}
	if lim > 0 && req > lim {
		return 0, fmt.Errorf("capacity_range: required_bytes %d exceeds limit_bytes %d: %w", req, lim, ErrOutOfRange)
	}
	size := req
	if size == 0 {
		size = DefaultVolumeSize
		if lim > 0 && lim < size {
			size = lim
		}
	}
	size = alignUp(size)
	if lim > 0 && size > lim {
		return 0, fmt.Errorf("capacity_range: %d bytes rounded up to %d exceeds limit_bytes %d: %w", req, size, lim, ErrOutOfRange)
	}
	return size, nil
}

func alignUp(n int64) int64 {
	return (n + SizeAlignment - 1) / SizeAlignment * SizeAlignment
}
