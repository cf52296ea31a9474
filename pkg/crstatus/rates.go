package crstatus

import (
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// EngineRates are the pool's per-volume rates for a Raid10Volume's spec.rates (a field of 0:
// the node's); nil: the node's.
func EngineRates(r *v1alpha1.VolumeRates) raid10.Rates {
	if r == nil {
		return raid10.Rates{}
	}
	return raid10.Rates{SyncMin: r.RebuildRateMin, SyncMax: r.RebuildRateMax, ScrubMax: r.ScrubRateMax}
}
