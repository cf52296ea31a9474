package driver

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
)

// applyScrubScheduleLocked does for spec.scrubSchedule what applyRatesLocked does for
// spec.rates: it puts vol's scrub schedule on the pool (pool.SetVolumeScrubSchedule; absent:
// the node's) when it differs from what the store last put there, so also once after a
// start, and returns what status.scrubSchedule reports, the spec's once set, else prev. The
// caller holds s.mu.
func (s *LocalStore) applyScrubScheduleLocked(vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeScrubSchedule) *v1alpha1.VolumeScrubSchedule {
	want := crstatus.EngineScrubSchedule(vol.Spec.ScrubSchedule)
	if last, known := s.scrubSchedules[vol.Name]; known && last == want {
		return vol.Spec.ScrubSchedule.DeepCopy()
	}
	if err := crstatus.SetScrubSchedule(s.pool.SetVolumeScrubSchedule, vol.Name, want); err != nil {
		klog.ErrorS(err, "Setting the volume's scrub schedule", "volumeID", vol.Name)
		return prev.DeepCopy()
	}
	s.scrubSchedules[vol.Name] = want
	klog.InfoS("Volume scrub schedule set", "volumeID", vol.Name, "scrubSchedule", want)
	return vol.Spec.ScrubSchedule.DeepCopy()
}
