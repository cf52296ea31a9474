package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// modifyScrubSuite: a volume's scrub schedule from CreateVolume (StorageClass parameters,
// overridden key by key by mutable_parameters) into spec.scrubSchedule, and
// ControllerModifyVolume merging a class's scrub keys beside its other keys (a key not named
// keeps its value, "node" returns the volume to the node's schedule, a bad key is
// InvalidArgument naming it and changes nothing). Part of modifySuite, so it runs over the
// fake client and the real kube-apiserver, whose CRD schema must keep the field.
func modifyScrubSuite(t *testing.T, c client.Client, cc csi.ControllerClient) {
	ctx := t.Context()
	const id = "pvc-scrub"
	want := func(t *testing.T, w *v1alpha1.VolumeScrubSchedule) *v1alpha1.Raid10Volume {
		t.Helper()
		var v v1alpha1.Raid10Volume
		if err := c.Get(ctx, client.ObjectKey{Name: id}, &v); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(v.Spec.ScrubSchedule, w) {
			t.Fatalf("spec.scrubSchedule = %+v, want %+v", v.Spec.ScrubSchedule, w)
		}
		return &v
	}
	modify := func(t *testing.T, params map[string]string) {
		t.Helper()
		if _, err := cc.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: params}); err != nil {
			t.Fatal(err)
		}
	}

	req := createReq(id, gib, "node-a")
	req.Parameters[ParamScrubSchedule] = "monthly"
	req.Parameters[ParamScrubWindow] = "2h"
	req.MutableParameters = map[string]string{ParamScrubSchedule: "weekly"} // the class wins
	if _, err := cc.CreateVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	want(t, &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Window: "2h"})

	modify(t, map[string]string{ParamScrubStart: "03:15", ParamScrubRepair: "true", ParamMaxWriteIOPS: "300"})
	v := want(t, &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Start: "03:15", Window: "2h", Repair: true})
	if v.Spec.Limits == nil || v.Spec.Limits.WriteIOPS != 300 {
		t.Fatalf("spec.limits = %+v beside the schedule, want writeIOPS 300", v.Spec.Limits)
	}
	modify(t, map[string]string{ParamMaxWriteIOPS: "0"}) // a limit alone keeps the schedule
	before := want(t, &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Start: "03:15", Window: "2h", Repair: true})
	modify(t, map[string]string{ParamScrubSchedule: "weekly"})
	if after := want(t, before.Spec.ScrubSchedule); after.Generation != before.Generation {
		t.Fatalf("generation %d after an unchanged modify, was %d", after.Generation, before.Generation)
	}
	for _, tc := range []struct{ name, key, value string }{
		{"Unknown", "scrubInterval", "168h"},
		{"Malformed", ParamScrubWindow, "long"},
		{"NodeWithStart", ParamScrubStart, "04:00"}, // beside scrubSchedule=node below
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cc.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
				MutableParameters: map[string]string{ParamScrubSchedule: "node", tc.key: tc.value}})
			wantCode(t, err, codes.InvalidArgument, tc.key)
		})
	}
	want(t, before.Spec.ScrubSchedule)

	modify(t, map[string]string{ParamScrubSchedule: "node"})
	want(t, nil)
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}
