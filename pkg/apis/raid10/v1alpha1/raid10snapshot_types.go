package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Raid10SnapshotSpec is what the controller plugin asks of the node agent: a point-in-time
// copy of one Raid10Volume on its node.
type Raid10SnapshotSpec struct {
	// Source is the Raid10Volume (CSI volume ID) the snapshot is cut from.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable"
	Source string `json:"source"`
	// Node is the Kubernetes node of the source volume, whose pool holds the snapshot.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	Node string `json:"node"`
}

// SnapshotPhase is where a Raid10Snapshot is in its life.
// +kubebuilder:validation:Enum=Pending;Copying;Ready;Deleting;Failed
type SnapshotPhase string

// The phases of a Raid10Snapshot. An empty phase means the node agent has not seen it yet.
const (
	// SnapshotPhasePending: the agent has not cut it yet.
	SnapshotPhasePending SnapshotPhase = "Pending"
	// SnapshotPhaseCopying: cut (status.cutAt is the point in time it holds); the pool is
	// copying the source's data as of the cut into the snapshot's own extents.
	SnapshotPhaseCopying SnapshotPhase = "Copying"
	// SnapshotPhaseReady: every byte is copied; the snapshot depends on nothing.
	SnapshotPhaseReady SnapshotPhase = "Ready"
	// SnapshotPhaseDeleting: deleted, waiting until the pool may free its extents (a
	// restore from it is still copying).
	SnapshotPhaseDeleting SnapshotPhase = "Deleting"
	// SnapshotPhaseFailed: not cut (no room, the source is gone) or lost (message).
	SnapshotPhaseFailed SnapshotPhase = "Failed"
)

// Raid10SnapshotStatus is reported by the node agent.
type Raid10SnapshotStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is where the snapshot is in its life.
	// +optional
	Phase SnapshotPhase `json:"phase,omitempty"`
	// CutAt is the point in time the snapshot holds (the CSI creation_time): when the
	// pool made the cut durable.
	// +optional
	CutAt *metav1.Time `json:"cutAt,omitempty"`
	// ReadyToUse is true once the copy is complete (the CSI ready_to_use).
	// +optional
	ReadyToUse bool `json:"readyToUse"`
	// SizeBytes is the size of the data the snapshot holds (the source's size at the cut):
	// the smallest volume it can be restored into.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Size is SizeBytes as a quantity, for display.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// CopiedBytes of SizeBytes are copied into the snapshot's extents.
	// +optional
	CopiedBytes int64 `json:"copiedBytes"`
	// Percent copied, 0 to 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	Percent int32 `json:"percent"`
	// Health is the redundancy state of the snapshot's own mirrored extents.
	// +optional
	Health VolumeHealth `json:"health,omitempty"`
	// Members is the number of member extents the snapshot is mirrored and striped over.
	// +optional
	Members int32 `json:"members,omitempty"`
	// Message is a human-readable summary of the last problem.
	// +optional
	Message string `json:"message,omitempty"`
	// Conditions: Ready (True once the copy is complete).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Raid10Snapshot is one point-in-time copy of a Raid10Volume, held in the pool of the
// volume's node: full-size, mirrored extents of its own, filled by a background copy after an
// instant cut. It depends on its source only until ReadyToUse.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=r10s,categories=raid10
// +kubebuilder:selectablefield:JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Progress",type=integer,JSONPath=`.status.percent`,description="Copy progress in percent"
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.phase`,priority=1
// +kubebuilder:printcolumn:name="CutAt",type=date,JSONPath=`.status.cutAt`,priority=1,description="The point in time the snapshot holds"
// +kubebuilder:printcolumn:name="Health",type=string,JSONPath=`.status.health`,priority=1
type Raid10Snapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   Raid10SnapshotSpec   `json:"spec"`
	Status Raid10SnapshotStatus `json:"status,omitempty"`
}

// Raid10SnapshotList is a list of Raid10Snapshot.
//
// +kubebuilder:object:root=true
type Raid10SnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Raid10Snapshot `json:"items"`
}
