package driver

import (
	"context"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// VolumeStore is the controller service's narrow view of the API server: the Raid10Volume,
// Raid10Snapshot and Raid10Node objects. KubeStore implements it with a controller-runtime client.
//
// Contract: a missing object is an error wrapping ErrNotFound; creating an existing name is an
// error wrapping ErrAlreadyExists (the raw collision, not a parameter comparison); writing a
// stale object (resourceVersion) is an error wrapping ErrConflict; context errors pass through.
type VolumeStore interface {
	// GetVolume returns the Raid10Volume named name.
	GetVolume(ctx context.Context, name string) (*v1alpha1.Raid10Volume, error)
	// ListVolumes returns every Raid10Volume, sorted by name.
	ListVolumes(ctx context.Context) ([]v1alpha1.Raid10Volume, error)
	// CreateVolume creates vol and fills in its server-set fields (resourceVersion, uid).
	CreateVolume(ctx context.Context, vol *v1alpha1.Raid10Volume) error
	// UpdateVolume writes vol's metadata and spec (not its status), guarded by its
	// resourceVersion, and fills in the new server-set fields.
	UpdateVolume(ctx context.Context, vol *v1alpha1.Raid10Volume) error
	// DeleteVolume asks for the deletion of the Raid10Volume named name (the node agent's
	// finalizer holds it until its extents are free). A missing volume is success.
	DeleteVolume(ctx context.Context, name string) error
	// GetNode returns the Raid10Node of the Kubernetes node name.
	GetNode(ctx context.Context, name string) (*v1alpha1.Raid10Node, error)
	// ListNodes returns every Raid10Node, sorted by name.
	ListNodes(ctx context.Context) ([]v1alpha1.Raid10Node, error)
	// GetSnapshot returns the Raid10Snapshot named name.
	GetSnapshot(ctx context.Context, name string) (*v1alpha1.Raid10Snapshot, error)
	// ListSnapshots returns every Raid10Snapshot, sorted by name.
	ListSnapshots(ctx context.Context) ([]v1alpha1.Raid10Snapshot, error)
	// CreateSnapshot creates snap and fills in its server-set fields.
	CreateSnapshot(ctx context.Context, snap *v1alpha1.Raid10Snapshot) error
	// DeleteSnapshot asks for the deletion of the Raid10Snapshot named name (the node
	// agent's finalizer holds it until its extents are free). A missing one is success.
	DeleteSnapshot(ctx context.Context, name string) error
}
