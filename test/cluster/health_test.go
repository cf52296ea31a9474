package cluster

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	r10 "github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// The kubelet's CSIVolumeHealth (alpha in Kubernetes 1.37, turned on for the rig's kubelet
// and API server) calls the plugin's NodeGetVolumeHealth for each pod volume and
// NodeGetStorageHealth for the driver every volumeStatsAggPeriod, and writes the answers into
// the pod's status.volumeHealth and the CSINode's status.storageHealth. The kubelet patches
// them only when the set of (status, reason) pairs changes.

// podVolumeHealth is the health conditions the kubelet wrote for pod p's volume "data".
func (s *story) podVolumeHealth(ctx context.Context, p string) ([]corev1.VolumeHealthCondition, error) {
	var pod corev1.Pod
	if err := s.c.Get(ctx, ctrlclient.ObjectKey{Namespace: "default", Name: p}, &pod); err != nil {
		return nil, err
	}
	for _, vh := range pod.Status.VolumeHealth {
		if vh.Name == "data" {
			return vh.HealthConditions, nil
		}
	}
	return nil, nil
}

// storageHealth is the storage health conditions the kubelet wrote for the driver in the
// node's CSINode.
func (s *story) storageHealth(ctx context.Context) ([]storagev1.StorageHealthCondition, error) {
	var n storagev1.CSINode
	if err := s.c.Get(ctx, ctrlclient.ObjectKey{Name: NodeName}, &n); err != nil {
		return nil, err
	}
	for _, sh := range n.Status.StorageHealth {
		if sh.Name == r10.DriverName {
			return sh.HealthConditions, nil
		}
	}
	return nil, nil
}

// healthShowsDegraded waits until every ioverify pod's volume shows the Degraded condition
// MemberDown and the CSINode the pulled disk (DiskFailed or DiskMissing) and the volumes
// that are not redundant.
func (s *story) healthShowsDegraded(ctx context.Context) {
	for _, p := range ioPods {
		s.poll(ctx, "pod "+p+" status.volumeHealth Degraded/MemberDown", func() error {
			conds, err := s.podVolumeHealth(ctx, p)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(conds, func(c corev1.VolumeHealthCondition) bool {
				return c.Status == corev1.VolumeHealthDegraded && c.Reason == "MemberDown"
			}) {
				return fmt.Errorf("volume health %+v", conds)
			}
			s.t.Logf("pod %s: status.volumeHealth %+v", p, conds)
			return nil
		})
	}
	s.poll(ctx, "CSINode status.storageHealth degraded", func() error {
		conds, err := s.storageHealth(ctx)
		if err != nil {
			return err
		}
		has := func(reasons ...string) bool {
			return slices.ContainsFunc(conds, func(c storagev1.StorageHealthCondition) bool {
				return c.Status == storagev1.StorageDegraded && slices.Contains(reasons, c.Reason)
			})
		}
		if !has("DiskFailed", "DiskMissing") || !has("VolumesNotRedundant") {
			return fmt.Errorf("storage health %+v", conds)
		}
		s.t.Logf("CSINode: status.storageHealth %+v", conds)
		return nil
	})
}

// healthCleared waits until no ioverify pod's volume has a health condition and the
// CSINode's storage health names no failed or missing disk and no volume that is not
// redundant.
func (s *story) healthCleared(ctx context.Context) {
	for _, p := range ioPods {
		s.poll(ctx, "pod "+p+" status.volumeHealth cleared", func() error {
			conds, err := s.podVolumeHealth(ctx, p)
			if err != nil {
				return err
			}
			if len(conds) > 0 {
				return fmt.Errorf("volume health %+v", conds)
			}
			return nil
		})
	}
	s.poll(ctx, "CSINode status.storageHealth cleared", func() error {
		conds, err := s.storageHealth(ctx)
		if err != nil {
			return err
		}
		for _, c := range conds {
			// Not DiskErrors: its counts (timeouts, stalls) are history, kept until the arrays
			// are assembled again.
			if slices.Contains([]string{"DiskFailed", "DiskMissing", "VolumesNotRedundant", "PoolUnusable"}, c.Reason) {
				return fmt.Errorf("storage health %+v", conds)
			}
		}
		s.t.Logf("CSINode: status.storageHealth after the rebuild %+v", conds)
		return nil
	})
}
