package crstatus

import (
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestStatusEncrypted: status.encrypted says what the volume's annotation
// raid10.csi.io/encrypted says, in the status of a provisioned volume and of a failed one.
func TestStatusEncrypted(t *testing.T) {
	now := time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC)
	info := pool.VolumeInfo{Size: 1 << 30, Health: pool.Healthy, InSync: 2, Members: members("in-sync", "in-sync")}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        bool
	}{
		{"encrypted", map[string]string{v1alpha1.EncryptedAnnotation: "true"}, true},
		{"plain", nil, false},
		{"other value", map[string]string{v1alpha1.EncryptedAnnotation: "no"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vol := &v1alpha1.Raid10Volume{}
			vol.Annotations = tc.annotations
			if got := VolumeStatus(v1alpha1.Raid10VolumeStatus{}, vol, info, nil, now).Encrypted; got != tc.want {
				t.Errorf("VolumeStatus: encrypted %v, want %v", got, tc.want)
			}
			if got := FailedStatus(v1alpha1.Raid10VolumeStatus{}, vol, ReasonNotInPool, "gone", now).Encrypted; got != tc.want {
				t.Errorf("FailedStatus: encrypted %v, want %v", got, tc.want)
			}
		})
	}
}
