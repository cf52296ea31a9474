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

// DiskReplacementRequest asks the node agent to replace a failed or missing disk of the
// pool with another disk of the node, as `kubectl raid10 replace-disk` does. Every volume
// that had a member on the old disk gets an extent on the new one and rebuilds onto it.
// The old disk must already be Failed or Missing: the agent never takes a healthy disk
// out of service.
type DiskReplacementRequest struct {
	// OldDisk names the disk to replace: its id (as in status.disks[].id) or its path.
	// +kubebuilder:validation:MinLength=1
	OldDisk string `json:"oldDisk"`
	// NewPath is the device path of the new disk on the node (/dev/disk/by-id/...). The
	// disk must be blank (or a spare of the pool); one with a partition table, filesystem,
	// RAID or LVM signature is refused untouched unless Wipe is set.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:Pattern=`^/`
	NewPath string `json:"newPath"`
	// Wipe allows the agent to erase a foreign signature found on the new disk.
	// +optional
	Wipe bool `json:"wipe,omitempty"`
}

// Raid10NodeSpec is what an operator asks of a node's pool. The agent acts on each
// generation of the spec once and reports the outcome in status.lastDiskReplacement.
type Raid10NodeSpec struct {
	// DiskReplacement, when set, is a disk replacement for the agent to carry out. Setting
	// it again (a new metadata.generation) asks again, e.g. after a failed attempt.
	// +optional
	DiskReplacement *DiskReplacementRequest `json:"diskReplacement,omitempty"`
}

// DiskReplacementResult is the outcome of a disk replacement request.
// +kubebuilder:validation:Enum=Succeeded;Failed
type DiskReplacementResult string

// The outcomes of a disk replacement request.
const (
	DiskReplacementSucceeded DiskReplacementResult = "Succeeded"
	DiskReplacementFailed    DiskReplacementResult = "Failed"
)

// DiskReplacementStatus is the outcome of the last disk replacement request the agent
// carried out.
type DiskReplacementStatus struct {
	// ObservedGeneration is the metadata.generation whose spec.diskReplacement this is
	// the outcome of.
	ObservedGeneration int64 `json:"observedGeneration"`
	// OldDisk and NewPath repeat the request.
	OldDisk string `json:"oldDisk"`
	NewPath string `json:"newPath"`
	// Result is Succeeded (the volumes rebuild onto the new disk: see each Raid10Volume's
	// status.rebuild) or Failed (nothing changed; Message says why).
	Result DiskReplacementResult `json:"result"`
	// NewDisk is the id of the new disk in status.disks, when Succeeded.
	// +optional
	NewDisk string `json:"newDisk,omitempty"`
	// RebuildingVolumes names the volumes that had a member on the old disk and rebuild
	// onto the new one, when Succeeded.
	// +optional
	// +listType=set
	RebuildingVolumes []string `json:"rebuildingVolumes,omitempty"`
	// Message says what was done, or why the request was refused.
	// +optional
	Message string `json:"message,omitempty"`
	// Time is when the agent carried out the request.
	Time metav1.Time `json:"time"`
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
	// LastDiskReplacement is the outcome of the last spec.diskReplacement request.
	// +optional
	LastDiskReplacement *DiskReplacementStatus `json:"lastDiskReplacement,omitempty"`
}

// Raid10Node is one node's disk pool, named after the Kubernetes node and written by its
// agent. Its spec carries operator requests (a disk replacement); its status the pool.
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

	// +optional
	Spec   Raid10NodeSpec   `json:"spec,omitempty"`
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
