package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VolumeMode is how the volume is handed to a pod.
// +kubebuilder:validation:Enum=Filesystem;Block
type VolumeMode string

// The volume modes.
const (
	VolumeModeFilesystem VolumeMode = "Filesystem"
	VolumeModeBlock      VolumeMode = "Block"
)

// FSType is the filesystem the node plugin creates on a blank Filesystem volume.
// +kubebuilder:validation:Enum=ext4;xfs
type FSType string

// The supported filesystems.
const (
	FSTypeExt4 FSType = "ext4"
	FSTypeXFS  FSType = "xfs"
)

// Layout is the RAID10 geometry: near-2 (every chunk on two adjacent members), striped over
// Members members with ChunkSizeBytes chunks, as Linux md raid10 "n2".
type Layout struct {
	// Members is the number of member disks; even, at least 2.
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=32
	// +kubebuilder:validation:XValidation:rule="self % 2 == 0",message="members must be even"
	Members int32 `json:"members"`
	// ChunkSizeBytes is the stripe chunk size; a power of two from 4Ki to 16Mi.
	// +kubebuilder:validation:Minimum=4096
	// +kubebuilder:validation:Maximum=16777216
	// +kubebuilder:validation:XValidation:rule="self in [4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608, 16777216]",message="chunkSizeBytes must be a power of two"
	ChunkSizeBytes int64 `json:"chunkSizeBytes"`
}

// Raid10VolumeSpec is what the controller plugin asks of the node agent.
// +kubebuilder:validation:XValidation:rule="self.volumeMode == 'Block' || has(self.fsType)",message="fsType is required for Filesystem volumes"
type Raid10VolumeSpec struct {
	// Node is the Kubernetes node whose local disks hold the array.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	Node string `json:"node"`
	// SizeBytes is the usable size of the volume (after mirroring). It may grow, never shrink.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="sizeBytes may not shrink"
	SizeBytes int64 `json:"sizeBytes"`
	// Layout is the RAID10 geometry.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="layout is immutable"
	Layout Layout `json:"layout"`
	// VolumeMode is Filesystem or Block.
	VolumeMode VolumeMode `json:"volumeMode"`
	// FSType is the filesystem of a Filesystem volume.
	// +optional
	FSType FSType `json:"fsType,omitempty"`
	// Source, when set, makes the volume a restore of a Raid10Snapshot or a clone of another
	// Raid10Volume of the same node: it starts as the source's data (a clone: as of its
	// creation) and copies it into its own extents in the background (status.hydration).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable"
	Source *VolumeSource `json:"source,omitempty"`
	// Scrub asks the node agent for a scrub of the volume (`kubectl raid10 scrub`): one each
	// time request changes; the agent answers in status.scrub.
	// +optional
	Scrub *ScrubRequest `json:"scrub,omitempty"`
	// Limits are the volume's QoS limits (StorageClass parameters, a VolumeAttributesClass
	// through ControllerModifyVolume): the node agent puts them on the array, live, and again
	// whenever it assembles it. Absent or all zero: unlimited.
	// +optional
	Limits *VolumeLimits `json:"limits,omitempty"`
	// Rates are the speeds of the volume's rebuilds and scrubs (StorageClass parameters, a
	// VolumeAttributesClass): the node agent puts them on the array, live, and again whenever
	// it assembles it. Absent or a field of 0: the node's (node.pool.rebuildRateMax).
	// +optional
	Rates *VolumeRates `json:"rates,omitempty"`
	// ScrubSchedule is the volume's own scrub schedule (StorageClass parameters, a
	// VolumeAttributesClass): the node agent puts it on the pool, live, and again after every
	// start. Absent: the volume follows the node's schedule (node.pool.scrub).
	// +optional
	ScrubSchedule *VolumeScrubSchedule `json:"scrubSchedule,omitempty"`
}

// VolumeScrubSchedule is a volume's scrub schedule of its own, the fields of the node's
// scrub configuration. It is whole in itself: a field left empty takes the pool's default
// (start 01:00, window 6h, check only), not the node's value, so that the class alone says
// what the volume gets.
type VolumeScrubSchedule struct {
	// Schedule is when a new scrub cycle starts: monthly (the first Sunday of the month),
	// weekly (every Sunday) or off (no scheduled scrub for this volume).
	// +kubebuilder:validation:Enum=monthly;weekly;off
	Schedule string `json:"schedule"`
	// Start is the time of day (the node's local time, HH:MM) the nightly window opens.
	// +optional
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	Start string `json:"start,omitempty"`
	// Window is how long a scheduled scrub runs each night before it pauses (a duration,
	// 4h; more than 0, at most 24h).
	// +optional
	Window string `json:"window,omitempty"`
	// Repair makes the volume's scheduled scrubs repair instead of check.
	// +optional
	Repair bool `json:"repair,omitempty"`
}

// VolumeRates are the volume's background rates in bytes per second, as md's
// sync_speed_min and sync_speed_max. A field of 0 (or absent) takes the node's value: the
// pool's rebuildRateMax for the rebuild's ceiling, the engine's defaults otherwise
// (1000 KiB/s floor, 200000 KiB/s ceiling), the rebuild's ceiling for a scrub.
type VolumeRates struct {
	// RebuildRateMin is the rate a rebuild, resync, scrub or copy keeps even while the
	// volume takes I/O of its own.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RebuildRateMin int64 `json:"rebuildRateMin,omitempty"`
	// RebuildRateMax is the ceiling of a rebuild, a resync and a restore's or clone's copy.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RebuildRateMax int64 `json:"rebuildRateMax,omitempty"`
	// ScrubRateMax is the ceiling of a scrub (check or repair).
	// +optional
	// +kubebuilder:validation:Minimum=0
	ScrubRateMax int64 `json:"scrubRateMax,omitempty"`
}

// VolumeLimits caps the requests that reach a volume from its block device: each rate is a
// token bucket whose burst is what passes at once after an idle time. A rate of 0 (or
// absent) is unlimited; a burst of 0 is a tenth of a second at the rate; a burst without its
// rate is ignored. Discard and write-zeroes count as one write request and no bytes. The
// engine's own I/O (rebuild, scrub, copies) is not counted.
type VolumeLimits struct {
	// ReadIOPS is read requests per second.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ReadIOPS int64 `json:"readIOPS,omitempty"`
	// ReadIOPSBurst is read requests.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ReadIOPSBurst int64 `json:"readIOPSBurst,omitempty"`
	// WriteIOPS is write requests per second.
	// +optional
	// +kubebuilder:validation:Minimum=0
	WriteIOPS int64 `json:"writeIOPS,omitempty"`
	// WriteIOPSBurst is write requests.
	// +optional
	// +kubebuilder:validation:Minimum=0
	WriteIOPSBurst int64 `json:"writeIOPSBurst,omitempty"`
	// ReadBytesPerSecond is bytes read per second.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ReadBytesPerSecond int64 `json:"readBytesPerSecond,omitempty"`
	// ReadBytesBurst is bytes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ReadBytesBurst int64 `json:"readBytesBurst,omitempty"`
	// WriteBytesPerSecond is bytes written per second.
	// +optional
	// +kubebuilder:validation:Minimum=0
	WriteBytesPerSecond int64 `json:"writeBytesPerSecond,omitempty"`
	// WriteBytesBurst is bytes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	WriteBytesBurst int64 `json:"writeBytesBurst,omitempty"`
}

// VolumeSource is where a volume's initial data comes from: exactly one of its fields.
// +kubebuilder:validation:XValidation:rule="has(self.snapshot) != has(self.volume)",message="exactly one of snapshot and volume"
type VolumeSource struct {
	// Snapshot is the Raid10Snapshot (CSI snapshot ID) to restore.
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// Volume is the Raid10Volume (CSI volume ID) to clone.
	// +optional
	Volume string `json:"volume,omitempty"`
}

// HydrationStatus is the copy of a restored or cloned volume's source into its own extents.
type HydrationStatus struct {
	// Hydrated is true once every byte is copied: the volume no longer needs its source.
	Hydrated bool `json:"hydrated"`
	// CopiedBytes of TotalBytes are copied.
	CopiedBytes int64 `json:"copiedBytes"`
	TotalBytes  int64 `json:"totalBytes"`
	// Percent copied, 0 to 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Percent int32 `json:"percent"`
}

// ScrubKind is what a scrub does.
// +kubebuilder:validation:Enum=check;repair
type ScrubKind string

// Scrub kinds.
const (
	// ScrubKindCheck compares the two copies of every chunk and counts the blocks that
	// differ (md's check).
	ScrubKindCheck ScrubKind = "check"
	// ScrubKindRepair also rewrites the second copy of each differing block from the first
	// (md's repair).
	ScrubKindRepair ScrubKind = "repair"
)

// ScrubRequest asks for one scrub.
type ScrubRequest struct {
	// Kind is check (the default) or repair.
	// +optional
	Kind ScrubKind `json:"kind,omitempty"`
	// Request identifies the request (kubectl raid10 writes the time): the agent starts a
	// scrub whenever it differs from status.scrub.request.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Request string `json:"request"`
}

// ScrubState is where a volume's last scrub is.
// +kubebuilder:validation:Enum=Running;Paused;Done;Failed
type ScrubState string

// Scrub states.
const (
	ScrubStateRunning ScrubState = "Running"
	// ScrubStatePaused: stopped before the end (its scheduled window closed).
	ScrubStatePaused ScrubState = "Paused"
	ScrubStateDone   ScrubState = "Done"
	// ScrubStateFailed: the scrub stopped on an error or could not start (message).
	ScrubStateFailed ScrubState = "Failed"
)

// ScrubStatus is the volume's current or last scrub.
type ScrubStatus struct {
	// Request is the spec.scrub.request the agent last acted on.
	// +optional
	Request string     `json:"request,omitempty"`
	State   ScrubState `json:"state"`
	Kind    ScrubKind  `json:"kind"`
	// Scheduled is true for a scrub the node's schedule started.
	// +optional
	Scheduled bool `json:"scheduled,omitempty"`
	// Percent done, 0 to 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Percent int32 `json:"percent"`
	// DoneBytes of TotalBytes of the array are visited.
	DoneBytes  int64 `json:"doneBytes"`
	TotalBytes int64 `json:"totalBytes"`
	// BytesPerSecond is the rate while it runs.
	// +optional
	BytesPerSecond int64 `json:"bytesPerSecond,omitempty"`
	// ETASeconds is the estimated time left at that rate.
	// +optional
	ETASeconds *int64 `json:"etaSeconds,omitempty"`
	// Mismatches counts the 4 KiB blocks whose copies differed in this pass, Repaired
	// those rewritten (repair), Lost those found with no readable copy.
	Mismatches int64 `json:"mismatches"`
	// +optional
	Repaired int64 `json:"repaired,omitempty"`
	// +optional
	Lost int64 `json:"lost,omitempty"`
	// StartTime is when the pass started; FinishTime when it ended, paused or failed.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	FinishTime *metav1.Time `json:"finishTime,omitempty"`
	// LastCompletedTime is when a scrub last reached the end of the volume.
	// +optional
	LastCompletedTime *metav1.Time `json:"lastCompletedTime,omitempty"`
	// Message says why a scrub failed or did not start.
	// +optional
	Message string `json:"message,omitempty"`
}

// VolumePhase is where a Raid10Volume is in its life.
// +kubebuilder:validation:Enum=Pending;Creating;Ready;Expanding;Deleting;Failed
type VolumePhase string

// The phases of a Raid10Volume. An empty phase means the node agent has not seen it yet.
const (
	VolumePhasePending   VolumePhase = "Pending"
	VolumePhaseCreating  VolumePhase = "Creating"
	VolumePhaseReady     VolumePhase = "Ready"
	VolumePhaseExpanding VolumePhase = "Expanding"
	VolumePhaseDeleting  VolumePhase = "Deleting"
	VolumePhaseFailed    VolumePhase = "Failed"
)

// VolumeHealth is the redundancy state of the array.
// +kubebuilder:validation:Enum=Healthy;Degraded;Rebuilding;Failed
type VolumeHealth string

// The health states of a Raid10Volume.
const (
	// VolumeHealthHealthy: every member in sync.
	VolumeHealthHealthy VolumeHealth = "Healthy"
	// VolumeHealthDegraded: at least one member failed or missing, or blocks recorded bad
	// (status.badBlocks); every chunk but the lost blocks (status.lostBlocks) still has a copy.
	VolumeHealthDegraded VolumeHealth = "Degraded"
	// VolumeHealthRebuilding: a replacement member is being filled from its mirror.
	VolumeHealthRebuilding VolumeHealth = "Rebuilding"
	// VolumeHealthFailed: both copies of some chunk are lost; I/O fails.
	VolumeHealthFailed VolumeHealth = "Failed"
)

// MemberState is the state of one member of the array.
// +kubebuilder:validation:Enum=InSync;Rebuilding;Failed;Missing
type MemberState string

// The member states.
const (
	MemberStateInSync     MemberState = "InSync"
	MemberStateRebuilding MemberState = "Rebuilding"
	MemberStateFailed     MemberState = "Failed"
	MemberStateMissing    MemberState = "Missing"
)

// MemberStatus is one member slot of the array and the disk extent behind it.
type MemberStatus struct {
	// Index is the member's slot in the layout, from 0.
	Index int32 `json:"index"`
	// Disk is the stable identity (as in Raid10Node status.disks[].id) of the disk holding
	// this member; empty while the slot has no disk.
	// +optional
	Disk string `json:"disk,omitempty"`
	// State is the member's state.
	State MemberState `json:"state"`
	// Message says why a member is not InSync.
	// +optional
	Message string `json:"message,omitempty"`
	// BadBlocks is the number of 4 KiB blocks recorded bad on this member: its copy of them
	// holds no valid data, and reads are served from the mirror.
	// +optional
	BadBlocks int64 `json:"badBlocks,omitempty"`
	// Timeouts counts this member's requests that passed the node's member deadline
	// (--member-timeout) since the array was assembled.
	// +optional
	Timeouts int64 `json:"timeouts,omitempty"`
	// SlowStalls counts this member's stalls past the member deadline while it held the
	// last in-sync copy of some chunk: its requests were waited for and it was not failed
	// (failing it would have lost that chunk). A disk that stalls is a candidate for
	// replacement.
	// +optional
	SlowStalls int64 `json:"slowStalls,omitempty"`
}

// RebuildProgress is the progress of a running rebuild (recovery onto a replacement member).
type RebuildProgress struct {
	// Member is the index of the member being rebuilt.
	Member int32 `json:"member"`
	// Percent done, 0 to 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Percent int32 `json:"percent"`
	// DoneBytes of TotalBytes have been copied.
	DoneBytes int64 `json:"doneBytes"`
	// TotalBytes is the size of the member being rebuilt.
	TotalBytes int64 `json:"totalBytes"`
	// BytesPerSecond is the recent copy rate.
	// +optional
	BytesPerSecond int64 `json:"bytesPerSecond,omitempty"`
	// ETASeconds is the estimated time left at the recent rate.
	// +optional
	ETASeconds *int64 `json:"etaSeconds,omitempty"`
	// StartTime is when the rebuild started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
}

// Raid10VolumeStatus is reported by the node agent.
type Raid10VolumeStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is where the volume is in its life.
	// +optional
	Phase VolumePhase `json:"phase,omitempty"`
	// Health is the redundancy state of the array.
	// +optional
	Health VolumeHealth `json:"health,omitempty"`
	// Capacity is the usable size the array has now (may exceed spec.sizeBytes by rounding).
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`
	// Members lists every member slot.
	// +optional
	// +listType=map
	// +listMapKey=index
	Members []MemberStatus `json:"members,omitempty"`
	// InSync counts the members in sync against all members, as "4/4".
	// +optional
	InSync string `json:"inSync,omitempty"`
	// BadBlocks is the number of 4 KiB blocks recorded bad, summed over the members (a
	// block bad on one copy is still served by the other). Non-zero makes the volume
	// Degraded. Always written, so that `kubectl get r10v` shows 0 rather than nothing.
	// +optional
	BadBlocks int64 `json:"badBlocks"`
	// LostBlocks is the number of blocks bad on every copy: reads there fail with an I/O
	// error until the block is written again.
	// +optional
	LostBlocks int64 `json:"lostBlocks"`
	// Rebuild is the progress of a running rebuild; absent when none runs.
	// +optional
	Rebuild *RebuildProgress `json:"rebuild,omitempty"`
	// Scrub is the volume's current or last scrub (requested or scheduled).
	// +optional
	Scrub *ScrubStatus `json:"scrub,omitempty"`
	// Hydration is the copy from spec.source of a restored or cloned volume; absent for a
	// volume made blank.
	// +optional
	Hydration *HydrationStatus `json:"hydration,omitempty"`
	// DevicePath is the block device the array is served on, on its node (/dev/nbdN or
	// /dev/ublkbN).
	// +optional
	DevicePath string `json:"devicePath,omitempty"`
	// Frontend is how the node serves that device: nbd (the kernel's NBD client) or ublk
	// (the kernel's ublk driver, over io_uring), the latter followed by the newer ublk
	// features of the node's kernel in brackets, e.g. "ublk (UPDATE_SIZE, AUTO_BUF_REG)";
	// empty while the volume is not attached.
	// +optional
	Frontend string `json:"frontend,omitempty"`
	// Limits are the QoS limits the node agent last put on the array (spec.limits as
	// applied); absent when none are.
	// +optional
	Limits *VolumeLimits `json:"limits,omitempty"`
	// Rates are the background rates the node agent last put on the array (spec.rates as
	// applied); absent when the volume has the node's.
	// +optional
	Rates *VolumeRates `json:"rates,omitempty"`
	// ScrubSchedule is the scrub schedule the node agent last put on the pool
	// (spec.scrubSchedule as applied); absent when the volume follows the node's.
	// +optional
	ScrubSchedule *VolumeScrubSchedule `json:"scrubSchedule,omitempty"`
	// Encrypted is true when the volume's StorageClass asked for encryption at rest
	// (annotation raid10.csi.io/encrypted): the node stages it on a dm-crypt LUKS2 mapping,
	// so its disks hold ciphertext only.
	// +optional
	Encrypted bool `json:"encrypted,omitempty"`
	// Message is a human-readable summary of the last problem.
	// +optional
	Message string `json:"message,omitempty"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Raid10Volume is one RAID10 volume on one node's local disks.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=r10v,categories=raid10
// +kubebuilder:selectablefield:JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.capacity`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Health",type=string,JSONPath=`.status.health`
// +kubebuilder:printcolumn:name="Members",type=string,JSONPath=`.status.inSync`
// +kubebuilder:printcolumn:name="BadBlocks",type=integer,JSONPath=`.status.badBlocks`,description="Blocks recorded bad, summed over the members"
// +kubebuilder:printcolumn:name="Rebuild",type=integer,JSONPath=`.status.rebuild.percent`,description="Rebuild progress in percent"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Copied",type=integer,JSONPath=`.status.hydration.percent`,priority=1,description="A restore's or clone's copy from its source, in percent"
// +kubebuilder:printcolumn:name="Device",type=string,JSONPath=`.status.devicePath`,priority=1
// +kubebuilder:printcolumn:name="Frontend",type=string,JSONPath=`.status.frontend`,priority=1,description="nbd or ublk (with the kernel's ublk features): how the node serves the device"
// +kubebuilder:printcolumn:name="Requested",type=integer,JSONPath=`.spec.sizeBytes`,priority=1
// +kubebuilder:printcolumn:name="LostBlocks",type=integer,JSONPath=`.status.lostBlocks`,priority=1,description="Blocks bad on every copy: reads there fail"
// +kubebuilder:printcolumn:name="Scrub",type=string,JSONPath=`.status.scrub.state`,priority=1,description="State of the current or last scrub"
// +kubebuilder:printcolumn:name="Mismatches",type=integer,JSONPath=`.status.scrub.mismatches`,priority=1,description="Blocks whose copies the last scrub found different"
// +kubebuilder:printcolumn:name="Encrypted",type=boolean,JSONPath=`.status.encrypted`,priority=1,description="Encrypted at rest (dm-crypt LUKS2 on the node)"
type Raid10Volume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   Raid10VolumeSpec   `json:"spec"`
	Status Raid10VolumeStatus `json:"status,omitempty"`
}

// Raid10VolumeList is a list of Raid10Volume.
//
// +kubebuilder:object:root=true
type Raid10VolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Raid10Volume `json:"items"`
}
