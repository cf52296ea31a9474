package driver

import (
	"context"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// KubeStore is the VolumeStore of a cluster: Raid10Volume and Raid10Node objects read and
// written through a controller-runtime client (whose scheme must include v1alpha1). Reads go
// straight to the API server when the client is not cached, which the controller's waits rely
// on to see the agent's status promptly.
type KubeStore struct {
	c client.Client
}

var _ VolumeStore = (*KubeStore)(nil)

// NewKubeStore returns a VolumeStore backed by c.
func NewKubeStore(c client.Client) *KubeStore { return &KubeStore{c: c} }

// kubeErr maps an API error to the store's sentinels.
func kubeErr(err error, what, name string) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s %q: %w", what, name, ErrNotFound)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%s %q: %w", what, name, ErrAlreadyExists)
	case apierrors.IsConflict(err):
		return fmt.Errorf("%s %q: %w", what, name, ErrConflict)
	case apierrors.IsInvalid(err):
		return fmt.Errorf("%s %q: %w: %w", what, name, ErrInvalidArgument, err)
	}
	return fmt.Errorf("%s %q: %w", what, name, err)
}

// GetVolume implements VolumeStore.
func (s *KubeStore) GetVolume(ctx context.Context, name string) (*v1alpha1.Raid10Volume, error) {
	var v v1alpha1.Raid10Volume
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
		return nil, kubeErr(err, "raid10volume", name)
	}
	return &v, nil
}

// ListVolumes implements VolumeStore.
func (s *KubeStore) ListVolumes(ctx context.Context) ([]v1alpha1.Raid10Volume, error) {
	var l v1alpha1.Raid10VolumeList
	if err := s.c.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list raid10volumes: %w", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, nil
}

// NodeField is the Raid10Volume and Raid10Snapshot field that names their node, selectable
// in the CRDs (selectableFields), so the API server filters on it.
const NodeField = "spec.node"

var _ NodeScopedStore = (*KubeStore)(nil)

// ListNodeVolumes implements NodeScopedStore: the API server filters by spec.node.
func (s *KubeStore) ListNodeVolumes(ctx context.Context, node string) ([]v1alpha1.Raid10Volume, error) {
	var l v1alpha1.Raid10VolumeList
	if err := s.c.List(ctx, &l, client.MatchingFields{NodeField: node}); err != nil {
		return nil, fmt.Errorf("list raid10volumes of node %q: %w", node, err)
	}
	return l.Items, nil
}

// ListNodeSnapshots implements NodeScopedStore: the API server filters by spec.node.
func (s *KubeStore) ListNodeSnapshots(ctx context.Context, node string) ([]v1alpha1.Raid10Snapshot, error) {
	var l v1alpha1.Raid10SnapshotList
	if err := s.c.List(ctx, &l, client.MatchingFields{NodeField: node}); err != nil {
		return nil, fmt.Errorf("list raid10snapshots of node %q: %w", node, err)
	}
	return l.Items, nil
}

// CreateVolume implements VolumeStore.
func (s *KubeStore) CreateVolume(ctx context.Context, vol *v1alpha1.Raid10Volume) error {
	return kubeErr(s.c.Create(ctx, vol), "raid10volume", vol.Name)
}

// UpdateVolume implements VolumeStore.
func (s *KubeStore) UpdateVolume(ctx context.Context, vol *v1alpha1.Raid10Volume) error {
	return kubeErr(s.c.Update(ctx, vol), "raid10volume", vol.Name)
}

// DeleteVolume implements VolumeStore.
func (s *KubeStore) DeleteVolume(ctx context.Context, name string) error {
	v := &v1alpha1.Raid10Volume{}
	v.Name = name
	err := s.c.Delete(ctx, v)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return kubeErr(err, "raid10volume", name)
}

// GetNode implements VolumeStore.
func (s *KubeStore) GetNode(ctx context.Context, name string) (*v1alpha1.Raid10Node, error) {
	var n v1alpha1.Raid10Node
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return nil, kubeErr(err, "raid10node", name)
	}
	return &n, nil
}

// ListNodes implements VolumeStore.
func (s *KubeStore) ListNodes(ctx context.Context) ([]v1alpha1.Raid10Node, error) {
	var l v1alpha1.Raid10NodeList
	if err := s.c.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list raid10nodes: %w", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, nil
}

// GetSnapshot implements VolumeStore.
func (s *KubeStore) GetSnapshot(ctx context.Context, name string) (*v1alpha1.Raid10Snapshot, error) {
	var v v1alpha1.Raid10Snapshot
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
		return nil, kubeErr(err, "raid10snapshot", name)
	}
	return &v, nil
}

// ListSnapshots implements VolumeStore.
func (s *KubeStore) ListSnapshots(ctx context.Context) ([]v1alpha1.Raid10Snapshot, error) {
	var l v1alpha1.Raid10SnapshotList
	if err := s.c.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list raid10snapshots: %w", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, nil
}

// CreateSnapshot implements VolumeStore.
func (s *KubeStore) CreateSnapshot(ctx context.Context, snap *v1alpha1.Raid10Snapshot) error {
	return kubeErr(s.c.Create(ctx, snap), "raid10snapshot", snap.Name)
}

// DeleteSnapshot implements VolumeStore.
func (s *KubeStore) DeleteSnapshot(ctx context.Context, name string) error {
	v := &v1alpha1.Raid10Snapshot{}
	v.Name = name
	err := s.c.Delete(ctx, v)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return kubeErr(err, "raid10snapshot", name)
}
