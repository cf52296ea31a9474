package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of the raid10.csi.io custom resources.
const GroupName = "raid10.csi.io"

// GroupVersion is the group and version of this package's types.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Raid10Volume{}, &Raid10VolumeList{},
		&Raid10Node{}, &Raid10NodeList{},
		&Raid10Snapshot{}, &Raid10SnapshotList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
