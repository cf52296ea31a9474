package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DiskState is the state of one local disk in a node's pool.
// +kubebuilder:validation:Enum=Healthy;Failed;Missing
type DiskState string

// The disk states.
const (
	DiskStateHealthy DiskState = "Healthy"
	DiskStateFailed  DiskState = "Failed"
	DiskStateMissing DiskState = "Missing"
)

// DiskStatus is one disk of the node's pool.
type DiskStatus struct {
	// ID is the disk's stable identity (WWN or serial, else the pool label's UUID).
	// +kubebuilder:validation:MinLength=1
	ID string `json:"id"`
	// Path is the device path on the node (/dev/nvme0n1), informative only.
	// +optional
	Path string `json:"path,omitempty"`
	// SizeBytes is the disk's size.
	SizeBytes int64 `json:"sizeBytes"`
	// FreeBytes is the largest extent a new member can still get on this disk.
	FreeBytes int64 `json:"freeBytes"`
	// State is the disk's state.
	State DiskState `json:"state"`
	// Message says why a disk is not Healthy.
	// +optional
	Message string `json:"message,omitempty"`
}

// NodeCapacity is the node's pool capacity.
type NodeCapacity struct {
	// Raw is the size of all healthy disks together.
	Raw resource.Quantity `json:"raw"`
	// Usable is Raw after mirroring and metadata: what volumes can hold.
	Usable resource.Quantity `json:"usable"`
	// Free is the usable size a new volume with the default layout can still get.
	Free resource.Quantity `json:"free"`
}

// Raid10NodeStatus is reported by the node agent.
type Raid10NodeStatus struct {
	// Disks lists the pool's disks.
	// +optional
	// +listType=map
	// +listMapKey=id
	Disks []DiskStatus `json:"disks,omitempty"`
	// DiskCount is the number of disks in the pool.
	DiskCount int32 `json:"diskCount"`
	// HealthyDisks is the number of Healthy disks.
	HealthyDisks int32 `json:"healthyDisks"`
	// Capacity is the pool's raw, usable and free capacity.
	// +optional
	Capacity NodeCapacity `json:"capacity,omitempty"`
	// Conditions: Ready (the agent runs and its pool is open).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Raid10Node is one node's disk pool, named after the Kubernetes node and written by its agent.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=r10n,categories=raid10
// +kubebuilder:printcolumn:name="Disks",type=integer,JSONPath=`.status.diskCount`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthyDisks`
// +kubebuilder:printcolumn:name="Usable",type=string,JSONPath=`.status.capacity.usable`
// +kubebuilder:printcolumn:name="Free",type=string,JSONPath=`.status.capacity.free`
// +kubebuilder:printcolumn:name="Raw",type=string,JSONPath=`.status.capacity.raw`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Raid10Node struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status Raid10NodeStatus `json:"status,omitempty"`
}

// Raid10NodeList is a list of Raid10Node.
//
// +kubebuilder:object:root=true
type Raid10NodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Raid10Node `json:"items"`
}
