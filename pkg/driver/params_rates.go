package driver

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// Per-volume rates of the background work (docs/parameters.md, "Rebuild and scrub rates"):
// StorageClass parameters and mutable parameters, like the QoS limits. They become the
// Raid10Volume's spec.rates, which the node agent puts on the array. Each is a quantity of
// bytes per second; 0 takes the node's value (node.pool.rebuildRateMax, the engine's
// defaults), so it never means unlimited. The names follow the node-wide rebuildRateMax.
const (
	// ParamRebuildRateMin is the rate a rebuild, resync, scrub or copy keeps even while the
	// volume takes I/O of its own (md's sync_speed_min).
	ParamRebuildRateMin = "rebuildRateMin"
	// ParamRebuildRateMax is the ceiling of a rebuild, a resync and a restore's or clone's
	// copy (md's sync_speed_max; the node's is node.pool.rebuildRateMax).
	ParamRebuildRateMax = "rebuildRateMax"
	// ParamScrubRateMax is the ceiling of a scrub (0: the rebuild's ceiling).
	ParamScrubRateMax = "scrubRateMax"
)

var rateParams = map[string]func(*v1alpha1.VolumeRates) *int64{
	ParamRebuildRateMin: func(r *v1alpha1.VolumeRates) *int64 { return &r.RebuildRateMin },
	ParamRebuildRateMax: func(r *v1alpha1.VolumeRates) *int64 { return &r.RebuildRateMax },
	ParamScrubRateMax:   func(r *v1alpha1.VolumeRates) *int64 { return &r.ScrubRateMax },
}

// rateParamNames lists the rate keys, sorted, for error messages.
var rateParamNames = strings.Join(slices.Sorted(maps.Keys(rateParams)), ", ")

// setRate is the one parser of a rate parameter, for StorageClass and mutable parameters
// alike: it sets k's field of r from v. known is false when k is no rate key (r untouched);
// a malformed value is an error wrapping ErrInvalidArgument naming k.
func setRate(r *v1alpha1.VolumeRates, k, v string) (known bool, err error) {
	field, ok := rateParams[k]
	if !ok {
		return false, nil
	}
	q, qerr := resource.ParseQuantity(v)
	n, exact := q.AsInt64()
	if qerr != nil || !exact || n < 0 {
		return true, fmt.Errorf("parameter %s=%q: must be a byte quantity per second (100Mi), 0 for the node's rate: %w", k, v, ErrInvalidArgument)
	}
	*field(r) = n
	return true, nil
}

// parseMutableRates applies the rate keys of mutable parameters over cur, the volume's rates
// now (nil: the node's), and returns the result, nil when every rate is the node's. A key
// in does not name keeps its value in cur ("0" returns one to the node's). Keys that are no
// rate key are skipped: parseMutableParams validates every key.
func parseMutableRates(in map[string]string, cur *v1alpha1.VolumeRates) (*v1alpha1.VolumeRates, error) {
	var r v1alpha1.VolumeRates
	if cur != nil {
		r = *cur
	}
	for _, k := range slices.Sorted(maps.Keys(in)) {
		if _, err := setRate(&r, k, in[k]); err != nil {
			return nil, err
		}
	}
	if r == (v1alpha1.VolumeRates{}) {
		return nil, nil
	}
	return &r, nil
}
