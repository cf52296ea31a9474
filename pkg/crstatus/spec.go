package crstatus

import (
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// CreateOptions are the pool's options for vol's spec: its layout and, for a restore or a
// clone, its source (the pool's snapshot and volume names are the objects' names).
func CreateOptions(vol *v1alpha1.Raid10Volume) pool.CreateOptions {
	o := pool.CreateOptions{Members: int(vol.Spec.Layout.Members), ChunkSize: vol.Spec.Layout.ChunkSizeBytes}
	if s := vol.Spec.Source; s != nil {
		o.Source = &pool.Source{Snapshot: s.Snapshot, Volume: s.Volume}
	}
	return o
}
