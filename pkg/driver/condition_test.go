package driver

import (
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestVolumeConditionBlocks: ListVolumes' condition from the Raid10Volume status counts the
// bad and lost blocks when the agent's message does not.
func TestVolumeConditionBlocks(t *testing.T) {
	vol := &v1alpha1.Raid10Volume{Status: v1alpha1.Raid10VolumeStatus{Phase: v1alpha1.VolumePhaseReady,
		Health: v1alpha1.VolumeHealthDegraded, InSync: "4/4", BadBlocks: 3, LostBlocks: 1}}
	c := volumeCondition(vol)
	if !c.GetAbnormal() || !strings.Contains(c.GetMessage(), "1 blocks lost") || !strings.Contains(c.GetMessage(), "3 bad blocks in all") {
		t.Fatalf("condition %v", c)
	}
	vol.Status.Message = "3 bad blocks, 1 of them lost"
	if c := volumeCondition(vol); !c.GetAbnormal() || strings.Count(c.GetMessage(), "lost") != 1 {
		t.Fatalf("condition with the agent's message %v", c)
	}
}
