package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// ControllerServer is the CSI controller service. It provisions by writing Raid10Volume
// objects through its VolumeStore and waiting for the node agent's status; it never touches a
// disk. Its methods return the sentinels of errors.go; the interceptor maps them to codes.
type ControllerServer struct {
	csi.UnimplementedControllerServer

	store        VolumeStore
	capacity     CapacityReads // GetCapacity's reads when synced (WithCapacityReads); may be nil
	locks        *VolumeLocks
	readyTimeout time.Duration // longest wait for the agent within one call
	pollInterval time.Duration // how often a wait reads the volume when it cannot watch it
	waitResync   time.Duration // how often a wait that watches still reads; 0: DefaultWaitResync
}

var _ csi.ControllerServer = (*ControllerServer)(nil)

// volumeID is the Raid10Volume name (and CSI volume ID) for a CreateVolume name: the name
// itself when it is both a valid Kubernetes object name and a valid pool volume name (at most
// 63 bytes; the provisioner's pvc-<uid> always is), else a stable hash of it.
func volumeID(name string) string {
	if len(validation.IsDNS1123Subdomain(name)) == 0 && pool.ValidateName(name) == nil {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "r10v-" + hex.EncodeToString(sum[:16])
}

// CreateVolume creates the Raid10Volume for req.Name on the node the topology names and waits
// until that node's agent reports it Ready. A retry with the same name resumes the wait.
func (c *ControllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, fmt.Errorf("name: must not be empty: %w", ErrInvalidArgument)
	}
	shape, err := parseCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	params, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	// A VolumeAttributesClass's parameters take precedence over the StorageClass's.
	limits, err := parseMutableParams(req.GetMutableParameters(), &params.limits)
	if err != nil {
		return nil, err
	}
	rates, err := parseMutableRates(req.GetMutableParameters(), &params.rates)
	if err != nil {
		return nil, err
	}
	scrub, err := parseMutableScrub(req.GetMutableParameters(), params.scrub)
	if err != nil {
		return nil, err
	}
	src, err := parseContentSource(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	size, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	id := volumeID(name)
	if err := c.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer c.locks.Release(id)

	vol, err := c.store.GetVolume(ctx, id)
	switch {
	case err == nil:
		if err := compatible(vol, name, req.GetCapacityRange(), params.layout, shape); err != nil {
			return nil, err
		}
		if err := sameEncryption(vol, params); err != nil {
			return nil, err
		}
		if !sameSource(vol.Spec.Source, src) {
			return nil, fmt.Errorf("volume %q exists with another content source (%s): %w", id, describeSource(vol.Spec.Source), ErrAlreadyExists)
		}
		if vol.DeletionTimestamp != nil {
			return nil, fmt.Errorf("volume %q: an earlier attempt is still being cleaned up: %w", id, ErrOperationInFlight)
		}
	case errors.Is(err, ErrNotFound):
		var node string
		if src != nil {
			node, size, err = c.sourcePlacement(ctx, src, req.GetCapacityRange(), size, req.GetAccessibilityRequirements())
		} else {
			node, err = c.pickNode(ctx, req.GetAccessibilityRequirements())
		}
		if err != nil {
			return nil, err
		}
		if err := c.checkCapacity(ctx, node, params.layout, size, size, id); err != nil {
			return nil, err
		}
		vol = newVolume(id, name, node, size, params, shape)
		vol.Spec.Source, vol.Spec.Limits, vol.Spec.Rates, vol.Spec.ScrubSchedule = src, limits, rates, scrub
		if err := c.store.CreateVolume(ctx, vol); err != nil {
			if errors.Is(err, ErrAlreadyExists) {
				// Another controller replica won the race; the provisioner retries.
				return nil, fmt.Errorf("volume %q: created concurrently: %w", id, ErrConflict)
			}
			return nil, err
		}
	default:
		return nil, err
	}

	vol, err = c.waitReady(ctx, id, size, true)
	if err != nil {
		return nil, err
	}
	cv := csiVolume(vol)
	if params.frontend != "" {
		cv.VolumeContext = map[string]string{ParamFrontend: string(params.frontend)}
	}
	cv.VolumeContext = withEncrypted(cv.VolumeContext, params)
	cv.ContentSource = req.GetVolumeContentSource()
	return &csi.CreateVolumeResponse{Volume: cv}, nil
}

// compatible reports whether an existing volume answers a CreateVolume of that name,
// capacity range, layout and shape; if not, an error wrapping ErrAlreadyExists.
func compatible(vol *v1alpha1.Raid10Volume, name string, r *csi.CapacityRange, layout v1alpha1.Layout, shape volumeShape) error {
	if got := vol.Annotations[v1alpha1.CSINameAnnotation]; got != name {
		return fmt.Errorf("volume %q belongs to CreateVolume name %q, not %q: %w", vol.Name, got, name, ErrAlreadyExists)
	}
	sz := vol.Spec.SizeBytes
	if sz < r.GetRequiredBytes() || (r.GetLimitBytes() > 0 && sz > r.GetLimitBytes()) {
		return fmt.Errorf("volume %q exists with %d bytes, outside the range asked: %w", vol.Name, sz, ErrAlreadyExists)
	}
	if vol.Spec.Layout != layout {
		return fmt.Errorf("volume %q exists with %d members and %d-byte chunks: %w", vol.Name, vol.Spec.Layout.Members, vol.Spec.Layout.ChunkSizeBytes, ErrAlreadyExists)
	}
	if vol.Spec.VolumeMode != shape.mode || vol.Spec.FSType != shape.fsType {
		return fmt.Errorf("volume %q exists as %s %s: %w", vol.Name, vol.Spec.VolumeMode, vol.Spec.FSType, ErrAlreadyExists)
	}
	return nil
}

func newVolume(id, name, node string, size int64, p volumeParams, shape volumeShape) *v1alpha1.Raid10Volume {
	vol := &v1alpha1.Raid10Volume{
		Spec: v1alpha1.Raid10VolumeSpec{
			Node:       node,
			SizeBytes:  size,
			Layout:     p.layout,
			VolumeMode: shape.mode,
			FSType:     shape.fsType,
		},
	}
	vol.Name = id
	vol.Finalizers = []string{v1alpha1.VolumeFinalizer}
	vol.Annotations = map[string]string{v1alpha1.CSINameAnnotation: name}
	for k, v := range map[string]string{
		v1alpha1.PVCNameAnnotation:      p.pvcName,
		v1alpha1.PVCNamespaceAnnotation: p.pvcNamespace,
		v1alpha1.PVNameAnnotation:       p.pvName,
		maxSnapshotsAnnotation:          p.maxSnapshots,
		v1alpha1.EncryptedAnnotation:    encryptedAnnotation(p),
	} {
		if v != "" {
			vol.Annotations[k] = v
		}
	}
	return vol
}

// pickNode chooses the node for a new volume, as TopoLVM does: the first preferred segment
// with our key (with WaitForFirstConsumer that is the scheduler's node), else the first
// requisite one, else, without any requirement, the node with the most free usable bytes.
func (c *ControllerServer) pickNode(ctx context.Context, tr *csi.TopologyRequirement) (string, error) {
	for _, list := range [][]*csi.Topology{tr.GetPreferred(), tr.GetRequisite()} {
		for _, t := range list {
			if n := t.GetSegments()[v1alpha1.TopologyNodeKey]; n != "" {
				return n, nil
			}
		}
	}
	if len(tr.GetPreferred())+len(tr.GetRequisite()) > 0 {
		return "", fmt.Errorf("accessibility_requirements: no segment has the key %s: %w", v1alpha1.TopologyNodeKey, ErrInvalidArgument)
	}
	nodes, err := c.store.ListNodes(ctx)
	if err != nil {
		return "", err
	}
	best, bestFree := "", int64(-1)
	for i := range nodes {
		if f := nodes[i].Status.Capacity.Free.Value(); f > bestFree {
			best, bestFree = nodes[i].Name, f
		}
	}
	if best == "" {
		return "", fmt.Errorf("no node runs a raid10 agent (no Raid10Node): %w", ErrInsufficientCapacity)
	}
	return best, nil
}

// csiVolume is the CSI view of a Raid10Volume.
func csiVolume(vol *v1alpha1.Raid10Volume) *csi.Volume {
	capacity := vol.Spec.SizeBytes
	if vol.Status.Capacity != nil && vol.Status.Capacity.Value() > capacity {
		capacity = vol.Status.Capacity.Value()
	}
	return &csi.Volume{
		VolumeId:      vol.Name,
		CapacityBytes: capacity,
		AccessibleTopology: []*csi.Topology{
			{Segments: map[string]string{v1alpha1.TopologyNodeKey: vol.Spec.Node}},
		},
	}
}

// DeleteVolume deletes the Raid10Volume and waits until the node agent has freed its extents
// and removed the finalizer. A missing volume is success.
func (c *ControllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, fmt.Errorf("volume_id: must not be empty: %w", ErrInvalidArgument)
	}
	if err := c.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer c.locks.Release(id)
	vol, err := c.store.GetVolume(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return &csi.DeleteVolumeResponse{}, nil
	case err != nil:
		return nil, err
	case vol.DeletionTimestamp == nil:
		if err := c.sourceBusy(ctx, id); err != nil {
			return nil, err
		}
	}
	// Again for a volume being deleted: the standalone store retries a delete the pool
	// refused for now; for the API server it changes nothing.
	if err := c.store.DeleteVolume(ctx, id); err != nil {
		return nil, err
	}
	if err := c.waitGone(ctx, id); err != nil {
		return nil, fmt.Errorf("volume %q: deleted, extents not freed yet: %w", id, err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerExpandVolume grows spec.sizeBytes and waits until the node agent has grown the
// array (and, on a node where the volume is attached, its /dev/nbdX). While the agent reports
// the volume Expanding (the pool refused for now: not Healthy, no room after an extent) it
// answers Aborted at once with the agent's reason; the agent retries by itself and so does
// the resizer. Node expansion is required for Filesystem and Block volumes alike: the kernel's
// /dev/nbdX only learns the new size on the node (NodeExpandVolume resizes it in place, then
// grows a filesystem; in --mode=node the agent already resized an attached device, and the
// call finds nothing left to do, while --mode=all has no agent to do it).
func (c *ControllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, fmt.Errorf("volume_id: must not be empty: %w", ErrInvalidArgument)
	}
	if req.GetCapacityRange() == nil {
		return nil, fmt.Errorf("capacity_range: must be set: %w", ErrInvalidArgument)
	}
	size, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() != nil {
		if _, err := parseCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
			return nil, err
		}
	}
	if err := c.locks.TryAcquire(id); err != nil {
		return nil, err
	}
	defer c.locks.Release(id)

	vol, err := c.store.GetVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	if vol.DeletionTimestamp != nil {
		return nil, fmt.Errorf("volume %q is being deleted: %w", id, ErrFailedPrecondition)
	}
	if size > vol.Spec.SizeBytes {
		if err := c.checkCapacity(ctx, vol.Spec.Node, vol.Spec.Layout, size, size-vol.Spec.SizeBytes, id); err != nil {
			return nil, err
		}
		vol.Spec.SizeBytes = size
		if err := c.store.UpdateVolume(ctx, vol); err != nil {
			return nil, err
		}
	}
	vol, err = c.waitExpanded(ctx, id, max(size, vol.Spec.SizeBytes))
	if err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{
		CapacityBytes:         csiVolume(vol).CapacityBytes,
		NodeExpansionRequired: true, // Block too: the device's size changes on the node
	}, nil
}

// GetCapacity reports the usable free bytes (after mirroring) for a volume of the
// parameters' layout on the topology segment's node, or summed over all nodes without one.
func (c *ControllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if len(req.GetVolumeCapabilities()) > 0 {
		if _, err := parseCapabilities(req.GetVolumeCapabilities()); err != nil {
			return nil, err
		}
	}
	params, err := parseParams(withoutSidecarKeys(req.GetParameters()))
	if err != nil {
		// A class with a bad parameter must not look like a full node: with
		// WaitForFirstConsumer the scheduler would only say "did not have enough free
		// storage" and the claim's events would never name the parameter (seen on a real
		// kubelet, test/cluster). Answer the default layout's capacity; CreateVolume then
		// refuses the claim with InvalidArgument naming the parameter, which the provisioner
		// records as a ProvisioningFailed event on the claim.
		klog.V(2).InfoS("GetCapacity: invalid StorageClass parameters; answering the default layout's capacity so that CreateVolume reports them", "err", err)
		params = volumeParams{layout: v1alpha1.Layout{Members: DefaultMembers, ChunkSizeBytes: DefaultChunkSizeBytes}}
	}
	store := c.capacityStore()
	var nodes []v1alpha1.Raid10Node
	if seg := req.GetAccessibleTopology().GetSegments(); len(seg) > 0 {
		name := seg[v1alpha1.TopologyNodeKey]
		if name == "" {
			return &csi.GetCapacityResponse{AvailableCapacity: 0, MaximumVolumeSize: wrapperspb.Int64(0)}, nil
		}
		n, err := store.GetNode(ctx, name)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, err
		default:
			nodes = append(nodes, *n)
		}
	} else if nodes, err = store.ListNodes(ctx); err != nil {
		return nil, err
	}
	var total, largest int64
	for i := range nodes {
		free, err := nodeFree(ctx, store, &nodes[i], params.layout.Members, "")
		if err != nil {
			return nil, err
		}
		total += free
		largest = max(largest, free)
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: total,
		MaximumVolumeSize: wrapperspb.Int64(largest),
		MinimumVolumeSize: wrapperspb.Int64(SizeAlignment),
	}, nil
}

// sidecarKeyPrefix marks the StorageClass parameters that the CSI sidecars reserve for
// themselves (csi.storage.k8s.io/fstype, the secret references).
const sidecarKeyPrefix = "csi.storage.k8s.io/"

// withoutSidecarKeys drops the sidecars' reserved keys. external-provisioner strips them
// before CreateVolume, but its capacity controller (--enable-capacity) passes the
// StorageClass's parameters to GetCapacity as they are, so the chart's class, which sets
// csi.storage.k8s.io/fstype, would otherwise get InvalidArgument and no CSIStorageCapacity.
func withoutSidecarKeys(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		if !strings.HasPrefix(k, sidecarKeyPrefix) {
			out[k] = v
		}
	}
	return out
}

// ListVolumes lists every Raid10Volume. Their health is ControllerListVolumeHealth's
// (health_controller.go): CSI 1.13 took VolumeCondition out of this answer.
func (c *ControllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, fmt.Errorf("max_entries %d: must not be negative: %w", req.GetMaxEntries(), ErrInvalidArgument)
	}
	vols, err := c.store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	start, end, err := page(req.GetStartingToken(), req.GetMaxEntries(), len(vols))
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{}
	for i := start; i < end; i++ {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: csiVolume(&vols[i])})
	}
	if end < len(vols) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}

// page is the window [start, end) of a list of n entries that a List call with
// starting_token tok and max_entries maxEntries returns; the token is the index of the next entry
// (a previous answer's next_token). A token this plugin could not have given is
// ErrInvalidToken.
func page(tok string, maxEntries int32, n int) (start, end int, err error) {
	if tok != "" {
		start, err = strconv.Atoi(tok)
		if err != nil || start < 0 || start > n {
			return 0, 0, fmt.Errorf("starting_token %q: not a token this plugin gave: %w", tok, ErrInvalidToken)
		}
	}
	end = n
	if m := int(maxEntries); m > 0 && start+m < end {
		end = start + m
	}
	return start, end, nil
}

// ValidateVolumeCapabilities confirms the capabilities the volume supports.
func (c *ControllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, fmt.Errorf("volume_id: must not be empty: %w", ErrInvalidArgument)
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, fmt.Errorf("volume_capabilities: must not be empty: %w", ErrInvalidArgument)
	}
	vol, err := c.store.GetVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	if _, err := parseMutableParams(req.GetMutableParameters(), nil); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	shape, err := parseCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	if shape.mode != vol.Spec.VolumeMode {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %q is a %s volume", id, vol.Spec.VolumeMode)}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
		MutableParameters:  req.GetMutableParameters(),
	}}, nil
}

// ControllerGetCapabilities lists the controller's RPCs.
func (c *ControllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t},
		}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}
