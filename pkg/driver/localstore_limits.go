package driver

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
)

// applyLimitsLocked does for the standalone store what the node agent does through the API
// server: it puts vol's spec.limits on the pool when they differ from what the store last put
// there (nothing after a start: the pool keeps limits in memory only) and returns what
// status.limits reports, the spec's limits once set, else prev. The caller holds s.mu.
func (s *LocalStore) applyLimitsLocked(vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeLimits) *v1alpha1.VolumeLimits {
	want := crstatus.EngineLimits(vol.Spec.Limits)
	if last, known := s.limits[vol.Name]; known && last == want {
		return vol.Spec.Limits.DeepCopy()
	}
	if err := s.pool.SetVolumeLimits(vol.Name, want); err != nil {
		klog.ErrorS(err, "Setting the volume's QoS limits", "volumeID", vol.Name)
		return prev.DeepCopy()
	}
	s.limits[vol.Name] = want
	klog.InfoS("Volume QoS limits set", "volumeID", vol.Name, "limits", want)
	return vol.Spec.Limits.DeepCopy()
}
