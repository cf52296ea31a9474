package crstatus

import (
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// EngineLimits are the engine's QoS limits for a Raid10Volume's spec.limits; nil: none.
func EngineLimits(l *v1alpha1.VolumeLimits) raid10.Limits {
	if l == nil {
		return raid10.Limits{}
	}
	return raid10.Limits{
		ReadIOPS: l.ReadIOPS, ReadIOPSBurst: l.ReadIOPSBurst,
		WriteIOPS: l.WriteIOPS, WriteIOPSBurst: l.WriteIOPSBurst,
		ReadBytesPerSecond: l.ReadBytesPerSecond, ReadBytesBurst: l.ReadBytesBurst,
		WriteBytesPerSecond: l.WriteBytesPerSecond, WriteBytesBurst: l.WriteBytesBurst,
	}
}
