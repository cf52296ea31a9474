package driver

import (
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
)

// applyRatesLocked does for spec.rates what applyLimitsLocked does for spec.limits: it puts
// vol's rates on the pool (pool.SetVolumeRates) when they differ from what the store last
// put there, nothing after a start, and returns what status.rates reports, the spec's rates
// once set, else prev. The caller holds s.mu.
func (s *LocalStore) applyRatesLocked(vol *v1alpha1.Raid10Volume, prev *v1alpha1.VolumeRates) *v1alpha1.VolumeRates {
	want := crstatus.EngineRates(vol.Spec.Rates)
	if last, known := s.rates[vol.Name]; known && last == want {
		return vol.Spec.Rates.DeepCopy()
	}
	if err := s.pool.SetVolumeRates(vol.Name, want); err != nil {
		klog.ErrorS(err, "Setting the volume's rebuild and scrub rates", "volumeID", vol.Name)
		return prev.DeepCopy()
	}
	s.rates[vol.Name] = want
	klog.InfoS("Volume rates set", "volumeID", vol.Name, "rates", want)
	return vol.Spec.Rates.DeepCopy()
}
