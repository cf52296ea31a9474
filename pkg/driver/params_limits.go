package driver

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// Per-volume QoS limits (docs/parameters.md, "QoS limits"): StorageClass parameters and the
// mutable parameters of a VolumeAttributesClass (CreateVolume's mutable_parameters,
// ControllerModifyVolume). They become the Raid10Volume's spec.limits, which the node agent
// puts on the array. A rate of 0 is unlimited; a burst of 0 is a tenth of a second at its rate.
const (
	// ParamMaxReadIOPS is read requests per second, a whole number.
	ParamMaxReadIOPS = "maxReadIOPS"
	// ParamMaxReadIOPSBurst is the read requests that pass at once after an idle time.
	ParamMaxReadIOPSBurst = "maxReadIOPSBurst"
	// ParamMaxWriteIOPS is write requests per second (discard and write-zeroes included).
	ParamMaxWriteIOPS = "maxWriteIOPS"
	// ParamMaxWriteIOPSBurst is the write requests that pass at once after an idle time.
	ParamMaxWriteIOPSBurst = "maxWriteIOPSBurst"
	// ParamMaxReadBytesPerSecond is bytes read per second, a quantity (100Mi).
	ParamMaxReadBytesPerSecond = "maxReadBytesPerSecond"
	// ParamMaxReadBytesBurst is the bytes read at once after an idle time, a quantity.
	ParamMaxReadBytesBurst = "maxReadBytesBurst"
	// ParamMaxWriteBytesPerSecond is bytes written per second, a quantity (100Mi).
	ParamMaxWriteBytesPerSecond = "maxWriteBytesPerSecond"
	// ParamMaxWriteBytesBurst is the bytes written at once after an idle time, a quantity.
	ParamMaxWriteBytesBurst = "maxWriteBytesBurst"
)

// limitParam is one limit key: where it goes in spec.limits and how its value is written.
type limitParam struct {
	field func(*v1alpha1.VolumeLimits) *int64
	bytes bool // a quantity (100Mi); else a whole number
}

var limitParams = map[string]limitParam{
	ParamMaxReadIOPS:            {func(l *v1alpha1.VolumeLimits) *int64 { return &l.ReadIOPS }, false},
	ParamMaxReadIOPSBurst:       {func(l *v1alpha1.VolumeLimits) *int64 { return &l.ReadIOPSBurst }, false},
	ParamMaxWriteIOPS:           {func(l *v1alpha1.VolumeLimits) *int64 { return &l.WriteIOPS }, false},
	ParamMaxWriteIOPSBurst:      {func(l *v1alpha1.VolumeLimits) *int64 { return &l.WriteIOPSBurst }, false},
	ParamMaxReadBytesPerSecond:  {func(l *v1alpha1.VolumeLimits) *int64 { return &l.ReadBytesPerSecond }, true},
	ParamMaxReadBytesBurst:      {func(l *v1alpha1.VolumeLimits) *int64 { return &l.ReadBytesBurst }, true},
	ParamMaxWriteBytesPerSecond: {func(l *v1alpha1.VolumeLimits) *int64 { return &l.WriteBytesPerSecond }, true},
	ParamMaxWriteBytesBurst:     {func(l *v1alpha1.VolumeLimits) *int64 { return &l.WriteBytesBurst }, true},
}

// limitParamNames lists the limit keys, sorted, for error messages.
var limitParamNames = strings.Join(slices.Sorted(maps.Keys(limitParams)), ", ")

// setLimit is the one parser of a limit parameter, used for StorageClass parameters and for
// mutable parameters alike: it sets k's field of l from v. known is false when k is no limit
// key (l untouched); a malformed value is an error wrapping ErrInvalidArgument naming k.
func setLimit(l *v1alpha1.VolumeLimits, k, v string) (known bool, err error) {
	p, ok := limitParams[k]
	if !ok {
		return false, nil
	}
	var n int64
	if p.bytes {
		q, qerr := resource.ParseQuantity(v)
		var exact bool
		n, exact = q.AsInt64()
		if qerr != nil || !exact || n < 0 {
			return true, fmt.Errorf("parameter %s=%q: must be a byte quantity per second or burst (100Mi), 0 for no limit: %w", k, v, ErrInvalidArgument)
		}
	} else {
		var perr error
		n, perr = strconv.ParseInt(v, 10, 64)
		if perr != nil || n < 0 {
			return true, fmt.Errorf("parameter %s=%q: must be a whole number of requests, 0 for no limit: %w", k, v, ErrInvalidArgument)
		}
	}
	*p.field(l) = n
	return true, nil
}

// parseMutableParams applies mutable parameters (a VolumeAttributesClass's) over cur, the
// volume's limits now (nil: none), and returns the result, nil when no limit is left. A key
// that in does not name keeps its value in cur: nothing is cleared by omission ("0" lifts a
// limit). Every key must be a limit key, a rate key (which parseMutableRates applies) or a
// scrub key (parseMutableScrub); an
// unknown or malformed one is an error wrapping ErrInvalidArgument that names it.
func parseMutableParams(in map[string]string, cur *v1alpha1.VolumeLimits) (*v1alpha1.VolumeLimits, error) {
	var l v1alpha1.VolumeLimits
	if cur != nil {
		l = *cur
	}
	for _, k := range slices.Sorted(maps.Keys(in)) { // the first bad key, deterministically
		known, err := setLimit(&l, k, in[k])
		if err != nil {
			return nil, err
		}
		if !known { // a rate key (params_rates.go), checked here, applied by parseMutableRates
			known, err = setRate(&v1alpha1.VolumeRates{}, k, in[k])
		}
		if err == nil && !known { // a scrub key (params_scrub.go), applied by parseMutableScrub
			known, err = setScrub(&v1alpha1.VolumeScrubSchedule{}, k, in[k])
		}
		if err != nil {
			return nil, err
		}
		if !known {
			return nil, fmt.Errorf("mutable parameter %q: unknown (known: %s, %s, %s): %w", k, limitParamNames, rateParamNames, scrubParamNames, ErrInvalidArgument)
		}
	}
	return limitsOrNil(l), nil
}

// limitsOrNil is l, or nil when every field is 0 (spec.limits absent).
func limitsOrNil(l v1alpha1.VolumeLimits) *v1alpha1.VolumeLimits {
	if l == (v1alpha1.VolumeLimits{}) {
		return nil
	}
	return &l
}
