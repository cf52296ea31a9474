package driver

import (
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// modifySuite: QoS limits from CreateVolume (StorageClass parameters, overridden by
// mutable_parameters) into spec.limits, and ControllerModifyVolume merging a class's
// parameters into them (a key not named keeps its value, a repeat writes nothing, a bad key
// is InvalidArgument naming it and changes nothing). Part of controllerSuite: it runs over
// the fake client and the real kube-apiserver, whose CRD schema must keep the field.
func modifySuite(t *testing.T, c client.Client, cc csi.ControllerClient) {
	ctx := t.Context()
	get := func(t *testing.T) *v1alpha1.Raid10Volume {
		t.Helper()
		var v v1alpha1.Raid10Volume
		if err := c.Get(ctx, client.ObjectKey{Name: "pvc-qos"}, &v); err != nil {
			t.Fatal(err)
		}
		return &v
	}
	wantLimits := func(t *testing.T, want v1alpha1.VolumeLimits) *v1alpha1.Raid10Volume {
		t.Helper()
		v := get(t)
		if v.Spec.Limits == nil || *v.Spec.Limits != want {
			t.Fatalf("spec.limits = %+v, want %+v", v.Spec.Limits, want)
		}
		return v
	}
	modify := func(params map[string]string) error {
		_, err := cc.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-qos", MutableParameters: params})
		return err
	}

	t.Run("Capability", func(t *testing.T) {
		resp, err := cc.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
		if err != nil || !slices.ContainsFunc(resp.GetCapabilities(), func(c *csi.ControllerServiceCapability) bool {
			return c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME
		}) {
			t.Fatalf("ControllerGetCapabilities = %v, %v; want MODIFY_VOLUME", resp, err)
		}
	})

	t.Run("CreateWithLimits", func(t *testing.T) {
		bad := createReq("pvc-qos-bad", gib, "node-a")
		bad.MutableParameters = map[string]string{ParamMaxReadIOPS: "many"}
		_, err := cc.CreateVolume(ctx, bad)
		wantCode(t, err, codes.InvalidArgument, ParamMaxReadIOPS)

		req := createReq("pvc-qos", gib, "node-a")
		req.Parameters[ParamMaxReadIOPS] = "1000"
		req.Parameters[ParamMaxWriteBytesPerSecond] = "100Mi"
		req.MutableParameters = map[string]string{ParamMaxReadIOPS: "2000", ParamMaxWriteIOPS: "500"} // the class wins
		if _, err := cc.CreateVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
		wantLimits(t, v1alpha1.VolumeLimits{ReadIOPS: 2000, WriteIOPS: 500, WriteBytesPerSecond: 100 << 20})
	})

	t.Run("MergeKeepsOmittedKeys", func(t *testing.T) {
		if err := modify(map[string]string{ParamMaxWriteIOPS: "800", ParamMaxReadBytesPerSecond: "50Mi"}); err != nil {
			t.Fatal(err)
		}
		wantLimits(t, v1alpha1.VolumeLimits{ReadIOPS: 2000, WriteIOPS: 800, ReadBytesPerSecond: 50 << 20, WriteBytesPerSecond: 100 << 20})
	})

	t.Run("RepeatWritesNothing", func(t *testing.T) {
		before := get(t)
		if err := modify(map[string]string{ParamMaxWriteIOPS: "800"}); err != nil {
			t.Fatal(err)
		}
		if err := modify(nil); err != nil {
			t.Fatal(err)
		}
		if after := get(t); after.Generation != before.Generation {
			t.Fatalf("generation %d after an unchanged modify, was %d", after.Generation, before.Generation)
		}
	})

	t.Run("ZeroLiftsOneLimit", func(t *testing.T) {
		if err := modify(map[string]string{ParamMaxReadIOPS: "0"}); err != nil {
			t.Fatal(err)
		}
		wantLimits(t, v1alpha1.VolumeLimits{WriteIOPS: 800, ReadBytesPerSecond: 50 << 20, WriteBytesPerSecond: 100 << 20})
	})

	t.Run("Errors", func(t *testing.T) {
		before := get(t)
		for _, tc := range []struct {
			name string
			req  *csi.ControllerModifyVolumeRequest
			code codes.Code
			sub  string
		}{
			{"UnknownKey", &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-qos",
				MutableParameters: map[string]string{ParamMaxWriteIOPS: "1", "maxIOPS": "1"}}, codes.InvalidArgument, "maxIOPS"},
			{"LayoutKey", &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-qos",
				MutableParameters: map[string]string{ParamMembers: "6"}}, codes.InvalidArgument, ParamMembers},
			{"Malformed", &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-qos",
				MutableParameters: map[string]string{ParamMaxWriteBytesPerSecond: "-5Mi"}}, codes.InvalidArgument, ParamMaxWriteBytesPerSecond},
			{"NoVolumeID", &csi.ControllerModifyVolumeRequest{MutableParameters: map[string]string{ParamMaxWriteIOPS: "1"}}, codes.InvalidArgument, "volume_id"},
			{"UnknownVolume", &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-none",
				MutableParameters: map[string]string{ParamMaxWriteIOPS: "1"}}, codes.NotFound, "pvc-none"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := cc.ControllerModifyVolume(ctx, tc.req)
				wantCode(t, err, tc.code, tc.sub)
			})
		}
		if after := get(t); after.Generation != before.Generation || *after.Spec.Limits != *before.Spec.Limits {
			t.Fatalf("a refused modify changed spec.limits: %+v, was %+v", after.Spec.Limits, before.Spec.Limits)
		}
	})

	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-qos"}); err != nil {
		t.Fatal(err)
	}
	t.Run("Rates", func(t *testing.T) { modifyRatesSuite(t, c, cc) })
	t.Run("ScrubSchedule", func(t *testing.T) { modifyScrubSuite(t, c, cc) })
}
