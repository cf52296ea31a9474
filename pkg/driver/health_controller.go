package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// The controller has no disks: it answers the health calls from the Raid10Volume status the
// node agent writes (in --mode=all, the LocalStore's status made from the pool the same way),
// so its answer is as fresh as the agent's last status update. The disks are named as the
// volume's Raid10Node lists them (ID and path).

// ControllerGetVolumeHealth reports one volume's health from its Raid10Volume status.
func (c *ControllerServer) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if err := requireFields(field{"volume_id", id}); err != nil {
		return nil, err
	}
	vol, err := c.store.GetVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	names, err := c.diskNames(ctx, vol.Spec.Node)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: volumeHealth(vol.Name, &vol.Status, names)}, nil
}

// ControllerListVolumeHealth lists the volumes with an adverse health condition (the spec's
// "abnormal volume health entries"; a healthy volume is left out), sorted by volume ID and
// paged as ListVolumes is.
func (c *ControllerServer) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, fmt.Errorf("max_entries %d: must not be negative: %w", req.GetMaxEntries(), ErrInvalidArgument)
	}
	vols, err := c.store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := c.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	byNode := make(map[string]*v1alpha1.Raid10Node, len(nodes))
	for i := range nodes {
		byNode[nodes[i].Name] = &nodes[i]
	}
	var bad []*csi.VolumeHealth
	for i := range vols {
		if vh := volumeHealth(vols[i].Name, &vols[i].Status, nodeDiskNames(byNode[vols[i].Spec.Node])); abnormal(vh) {
			bad = append(bad, vh)
		}
	}
	start, end, err := page(req.GetStartingToken(), req.GetMaxEntries(), len(bad))
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{Entries: bad[start:end]}
	if end < len(bad) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}

// diskNames names the disks of node's pool; a node without a Raid10Node yet leaves the IDs
// as they are.
func (c *ControllerServer) diskNames(ctx context.Context, node string) (func(string) string, error) {
	n, err := c.store.GetNode(ctx, node)
	switch {
	case errors.Is(err, ErrNotFound):
		return nodeDiskNames(nil), nil
	case err != nil:
		return nil, err
	}
	return nodeDiskNames(n), nil
}

// nodeDiskNames names a disk ID as "path (ID)" from node's status.disks, or as the ID alone
// when node (nil: unknown) does not list it.
func nodeDiskNames(node *v1alpha1.Raid10Node) func(string) string {
	paths := map[string]string{}
	if node != nil {
		for _, d := range node.Status.Disks {
			paths[d.ID] = d.Path
		}
	}
	return func(id string) string {
		if p := paths[id]; p != "" && p != id {
			return p + " (" + id + ")"
		}
		return id
	}
}
