package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestGetCapacitySidecarKeys: external-provisioner's capacity controller sends GetCapacity
// the StorageClass's parameters unfiltered, with csi.storage.k8s.io/fstype and secret keys
// that it strips only before CreateVolume. GetCapacity ignores those reserved keys; anything
// else it does not know gets the default layout's capacity (CreateVolume refuses it, naming
// it: a class that looked full would hide the error behind the scheduler's "not enough free
// storage"; test/e2e TestRBACLeastPrivilege/PVCFlow runs the real sidecar).
func TestGetCapacitySidecarKeys(t *testing.T) {
	ctrl, _ := startDriver(t, fakeClient(t), DefaultReadyTimeout)
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   codes.Code
	}{
		{"ChartClass", map[string]string{"csi.storage.k8s.io/fstype": "ext4", ParamMembers: "4", ParamChunkSize: "512Ki"}, codes.OK},
		{"SecretRefs", map[string]string{"csi.storage.k8s.io/provisioner-secret-name": "s", "csi.storage.k8s.io/provisioner-secret-namespace": "ns"}, codes.OK},
		{"UnknownAnswered", map[string]string{"csi.storage.k8s.io/fstype": "ext4", "raidLevel": "5"}, codes.OK},
		{"BadMembersAnswered", map[string]string{"csi.storage.k8s.io/fstype": "xfs", ParamMembers: "3"}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ctrl.GetCapacity(t.Context(), &csi.GetCapacityRequest{Parameters: tc.params})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("GetCapacity(%v) = %v, want %v", tc.params, err, tc.want)
			}
		})
	}
}
