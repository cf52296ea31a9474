package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// modifyRatesSuite: rebuild and scrub rates from CreateVolume (StorageClass parameters,
// overridden by mutable_parameters) into spec.rates, and ControllerModifyVolume merging a
// class's rate keys into them beside the limits (a key not named keeps its value, "0" returns
// one to the node's, a bad key is InvalidArgument naming it and changes nothing). Part of
// modifySuite, so it runs over the fake client and the real kube-apiserver, whose CRD schema
// must keep the field and refuse a negative rate.
func modifyRatesSuite(t *testing.T, c client.Client, cc csi.ControllerClient) {
	ctx := t.Context()
	const id = "pvc-rates"
	get := func(t *testing.T) *v1alpha1.Raid10Volume {
		t.Helper()
		var v v1alpha1.Raid10Volume
		if err := c.Get(ctx, client.ObjectKey{Name: id}, &v); err != nil {
			t.Fatal(err)
		}
		return &v
	}
	wantRates := func(t *testing.T, want *v1alpha1.VolumeRates) *v1alpha1.Raid10Volume {
		t.Helper()
		v := get(t)
		if (v.Spec.Rates == nil) != (want == nil) || (want != nil && *v.Spec.Rates != *want) {
			t.Fatalf("spec.rates = %+v, want %+v", v.Spec.Rates, want)
		}
		return v
	}
	modify := func(t *testing.T, params map[string]string) {
		t.Helper()
		if _, err := cc.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: params}); err != nil {
			t.Fatal(err)
		}
	}

	req := createReq(id, gib, "node-a")
	req.Parameters[ParamRebuildRateMax] = "50Mi"
	req.Parameters[ParamScrubRateMax] = "20Mi"
	req.MutableParameters = map[string]string{ParamScrubRateMax: "10Mi"} // the class wins
	if _, err := cc.CreateVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	wantRates(t, &v1alpha1.VolumeRates{RebuildRateMax: 50 << 20, ScrubRateMax: 10 << 20})

	modify(t, map[string]string{ParamRebuildRateMin: "4Mi", ParamMaxWriteIOPS: "300"})
	v := wantRates(t, &v1alpha1.VolumeRates{RebuildRateMin: 4 << 20, RebuildRateMax: 50 << 20, ScrubRateMax: 10 << 20})
	if v.Spec.Limits == nil || *v.Spec.Limits != (v1alpha1.VolumeLimits{WriteIOPS: 300}) {
		t.Fatalf("spec.limits = %+v beside the rates, want writeIOPS 300", v.Spec.Limits)
	}
	modify(t, map[string]string{ParamMaxWriteIOPS: "300"}) // a limit alone keeps the rates
	modify(t, map[string]string{ParamScrubRateMax: "0"})
	before := wantRates(t, &v1alpha1.VolumeRates{RebuildRateMin: 4 << 20, RebuildRateMax: 50 << 20})
	modify(t, nil)
	if after := get(t); after.Generation != before.Generation {
		t.Fatalf("generation %d after an unchanged modify, was %d", after.Generation, before.Generation)
	}

	for _, tc := range []struct{ name, key, value string }{
		{"Unknown", "rebuildRate", "1Mi"},
		{"Malformed", ParamRebuildRateMax, "quick"},
		{"Negative", ParamScrubRateMax, "-1Mi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cc.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
				MutableParameters: map[string]string{ParamRebuildRateMin: "1Mi", tc.key: tc.value}})
			wantCode(t, err, codes.InvalidArgument, tc.key)
		})
	}
	wantRates(t, &v1alpha1.VolumeRates{RebuildRateMin: 4 << 20, RebuildRateMax: 50 << 20})

	modify(t, map[string]string{ParamRebuildRateMin: "0", ParamRebuildRateMax: "0"})
	wantRates(t, nil)
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}
