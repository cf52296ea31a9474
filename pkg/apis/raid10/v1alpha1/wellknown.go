package v1alpha1

// Well-known names shared by the controller plugin, the node agent and the manifests.
const (
	// DriverName is the CSI driver name.
	DriverName = "raid10.csi.io"
	// TopologyNodeKey is the topology key whose value is the node that holds a volume.
	TopologyNodeKey = "raid10.csi.io/node"
	// VolumeFinalizer keeps a Raid10Volume until the node agent has freed its extents.
	VolumeFinalizer = "raid10.csi.io/extents"
	// CSINameAnnotation records the CreateVolume name a Raid10Volume was created for (the
	// object name differs when that name is not a valid Kubernetes name).
	CSINameAnnotation = "raid10.csi.io/csi-name"
	// VolumeSnapshotNameAnnotation, VolumeSnapshotNamespaceAnnotation and
	// VolumeSnapshotContentNameAnnotation record the VolumeSnapshot a Raid10Snapshot was cut
	// for (from csi-snapshotter's extra create metadata).
	VolumeSnapshotNameAnnotation        = "raid10.csi.io/volumesnapshot-name"
	VolumeSnapshotNamespaceAnnotation   = "raid10.csi.io/volumesnapshot-namespace"
	VolumeSnapshotContentNameAnnotation = "raid10.csi.io/volumesnapshotcontent-name"
	// PVCNameAnnotation, PVCNamespaceAnnotation and PVNameAnnotation record the claim and
	// volume a Raid10Volume was provisioned for (from the provisioner's extra create metadata).
	PVCNameAnnotation      = "raid10.csi.io/pvc-name"
	PVCNamespaceAnnotation = "raid10.csi.io/pvc-namespace"
	PVNameAnnotation       = "raid10.csi.io/pv-name"
	// EncryptedAnnotation is "true" on a Raid10Volume whose StorageClass asked for
	// encryption at rest (parameter encrypted): the node stages it on a dm-crypt LUKS2
	// mapping, and the disks hold only its ciphertext.
	EncryptedAnnotation = "raid10.csi.io/encrypted"
	// ConditionReady is the condition type both resources report.
	ConditionReady = "Ready"
	// ConditionRedundant is the Raid10Volume condition that is True while every chunk has
	// both its copies (health Healthy) and False, with the health as its reason, while
	// redundancy is reduced (Degraded, Rebuilding with the progress, bad blocks) or data is
	// lost (Failed): `kubectl wait --for=condition=Redundant r10v/NAME` waits for a rebuild.
	ConditionRedundant = "Redundant"
	// ReasonInsufficientCapacity is the Ready condition reason (status False) that the node
	// agent sets on a Raid10Volume it cannot allocate; the controller then answers
	// ResourceExhausted so that the provisioner picks another node.
	ReasonInsufficientCapacity = "InsufficientCapacity"
	// ReasonSourceNotFound is the Ready condition reason (status False) that the node agent
	// sets on a Raid10Snapshot whose source volume, or a Raid10Volume whose spec.source, the
	// node's pool does not have; the controller then answers NotFound.
	ReasonSourceNotFound = "SourceNotFound"
)
