package driver

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// healthEntry is one VolumeHealth entry as the tests compare it.
type healthEntry struct {
	status csi.VolumeHealthErrorType
	reason string
}

// entriesOf lists vh's (status, reason) pairs and fails t unless each is unique and has a
// message.
func entriesOf(t *testing.T, vh *csi.VolumeHealth) []healthEntry {
	t.Helper()
	var out []healthEntry
	for _, e := range vh.GetHealthStatuses() {
		he := healthEntry{e.GetStatus(), e.GetReason()}
		if slices.Contains(out, he) || e.GetMessage() == "" || len(e.GetMessage()) > MaxHealthMessage {
			t.Fatalf("entry %v repeated, without a message or with one over %d bytes in %v", he, MaxHealthMessage, vh)
		}
		out = append(out, he)
	}
	return out
}

// messageOf is the message of vh's entry with reason, "" when it has none.
func messageOf(vh *csi.VolumeHealth, reason string) string {
	for _, e := range vh.GetHealthStatuses() {
		if e.GetReason() == reason {
			return e.GetMessage()
		}
	}
	return ""
}

// healthSuite: ControllerGetVolumeHealth and ControllerListVolumeHealth answer from the
// Raid10Volume status (written here as the node agent would, over any client: the fake one
// and the real kube-apiserver), and name the member's disk by its node's status.disks.
func healthSuite(t *testing.T, c client.Client, cc csi.ControllerClient, agent *testAgent) {
	ctx := t.Context()
	agent.setHold(true)
	defer agent.setHold(false)
	var vol v1alpha1.Raid10Volume
	if err := c.Get(ctx, client.ObjectKey{Name: "pvc-late"}, &vol); err != nil {
		t.Fatal(err)
	}
	healthy := vol.Status.DeepCopy()
	defer func() {
		var v v1alpha1.Raid10Volume
		if err := c.Get(ctx, client.ObjectKey{Name: "pvc-late"}, &v); err != nil {
			t.Fatal(err)
		}
		v.Status = *healthy
		if err := c.Status().Update(ctx, &v); err != nil {
			t.Fatal(err)
		}
	}()
	get := func(t *testing.T) *csi.VolumeHealth {
		t.Helper()
		resp, err := cc.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: "pvc-late"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetVolumeHealth().GetVolumeId() != "pvc-late" {
			t.Fatalf("volume health %v: want pvc-late's", resp)
		}
		return resp.GetVolumeHealth()
	}
	set := func(t *testing.T, st v1alpha1.Raid10VolumeStatus) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKey{Name: "pvc-late"}, &vol); err != nil {
			t.Fatal(err)
		}
		vol.Status = st
		if err := c.Status().Update(ctx, &vol); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("Healthy", func(t *testing.T) {
		if e := entriesOf(t, get(t)); len(e) != 0 {
			t.Fatalf("healthy volume has entries %v", e)
		}
		if listed := listHealth(t, cc, 0); slices.ContainsFunc(listed, func(vh *csi.VolumeHealth) bool { return vh.GetVolumeId() == "pvc-late" }) {
			t.Fatalf("ControllerListVolumeHealth lists the healthy pvc-late: %v", listed)
		}
	})

	eta := int64(63)
	st := *healthy.DeepCopy()
	st.Health, st.InSync, st.BadBlocks, st.LostBlocks = v1alpha1.VolumeHealthRebuilding, "2/4", 3, 1
	st.Members[1].State, st.Members[1].Message, st.Members[1].BadBlocks = v1alpha1.MemberStateFailed, "disk /dev/nvme1n1 failed", 3
	st.Members[2].State = v1alpha1.MemberStateRebuilding
	st.Rebuild = &v1alpha1.RebuildProgress{Member: 2, Percent: 42, DoneBytes: 42 << 20, TotalBytes: 100 << 20, BytesPerSecond: 1 << 20, ETASeconds: &eta}
	st.Scrub = &v1alpha1.ScrubStatus{Kind: v1alpha1.ScrubKindCheck, State: v1alpha1.ScrubStateDone, Mismatches: 5}
	st.Hydration = &v1alpha1.HydrationStatus{CopiedBytes: 10 << 20, TotalBytes: 100 << 20, Percent: 10}

	t.Run("EveryFact", func(t *testing.T) {
		set(t, st)
		vh := get(t)
		want := []healthEntry{
			{csi.VolumeHealthErrorType_DEGRADED, HealthReasonMemberDown},
			{csi.VolumeHealthErrorType_DEGRADED, HealthReasonRebuilding},
			{csi.VolumeHealthErrorType_DEGRADED, HealthReasonBadBlocks},
			{csi.VolumeHealthErrorType_DATA_LOSS, HealthReasonLostBlocks},
			{csi.VolumeHealthErrorType_DEGRADED, HealthReasonScrubMismatches},
			{csi.VolumeHealthErrorType_DEGRADED, HealthReasonCopying},
		}
		if got := entriesOf(t, vh); !slices.Equal(got, want) {
			t.Fatalf("entries %v, want %v", got, want)
		}
		for reason, subs := range map[string][]string{
			HealthReasonMemberDown:      {"member 1 Failed", "/dev/nvme1n1 (node-a-disk1)"},
			HealthReasonRebuilding:      {"member 2 on disk /dev/nvme2n1 (node-a-disk2)", "42%", "ETA 1m3s", "2/4"},
			HealthReasonBadBlocks:       {"3 blocks", "member 1: 3"},
			HealthReasonScrubMismatches: {"5 blocks"},
			HealthReasonCopying:         {"10%"},
		} {
			for _, s := range subs {
				if m := messageOf(vh, reason); !strings.Contains(m, s) {
					t.Errorf("%s message %q does not say %q", reason, m, s)
				}
			}
		}
		listed := listHealth(t, cc, 0)
		i := slices.IndexFunc(listed, func(vh *csi.VolumeHealth) bool { return vh.GetVolumeId() == "pvc-late" })
		if i < 0 || len(listed[i].GetHealthStatuses()) != len(want) {
			t.Fatalf("ControllerListVolumeHealth %v: want pvc-late with %d entries", listed, len(want))
		}
		paged := listHealth(t, cc, 1)
		if len(paged) != len(listed) {
			t.Fatalf("paged by one: %d entries, unpaged %d", len(paged), len(listed))
		}
	})

	t.Run("Failed", func(t *testing.T) {
		f := *healthy.DeepCopy()
		f.Phase, f.Health, f.InSync = v1alpha1.VolumePhaseFailed, v1alpha1.VolumeHealthFailed, "2/4"
		f.Members[0].State, f.Members[1].State = v1alpha1.MemberStateMissing, v1alpha1.MemberStateMissing
		f.Message = "array failed: member 0 missing; member 1 missing"
		f.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "ArrayFailed",
			Message: "Failed", LastTransitionTime: metav1.Now()}}
		set(t, f)
		vh := get(t)
		got := entriesOf(t, vh)
		if len(got) != 2 || got[0] != (healthEntry{csi.VolumeHealthErrorType_INACCESSIBLE, HealthReasonVolumeFailed}) ||
			got[1] != (healthEntry{csi.VolumeHealthErrorType_DEGRADED, HealthReasonMemberDown}) {
			t.Fatalf("entries %v: want INACCESSIBLE VolumeFailed, then MemberDown", got)
		}
		if m := messageOf(vh, HealthReasonVolumeFailed); !strings.Contains(m, "member 0 missing") {
			t.Fatalf("VolumeFailed message %q: want the agent's message", m)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		_, err := cc.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{})
		wantCode(t, err, codes.InvalidArgument, "volume_id")
		_, err = cc.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: "never-existed"})
		wantCode(t, err, codes.NotFound, "never-existed")
		_, err = cc.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{MaxEntries: -1})
		wantCode(t, err, codes.InvalidArgument, "max_entries")
		_, err = cc.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{StartingToken: "x"})
		wantCode(t, err, codes.Aborted, "starting_token")
	})
}

// listHealth pages through ControllerListVolumeHealth, maxEntries at a time (0: at once),
// and fails t on an entry without an adverse condition.
func listHealth(t *testing.T, cc csi.ControllerClient, maxEntries int32) []*csi.VolumeHealth {
	t.Helper()
	var all []*csi.VolumeHealth
	token := ""
	for {
		resp, err := cc.ControllerListVolumeHealth(t.Context(), &csi.ControllerListVolumeHealthRequest{MaxEntries: maxEntries, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if maxEntries > 0 && len(resp.GetEntries()) > int(maxEntries) {
			t.Fatalf("%d entries, max_entries %d", len(resp.GetEntries()), maxEntries)
		}
		for _, vh := range resp.GetEntries() {
			if len(vh.GetHealthStatuses()) == 0 {
				t.Fatalf("ControllerListVolumeHealth lists %s without an adverse condition", vh.GetVolumeId())
			}
		}
		all = append(all, resp.GetEntries()...)
		if token = resp.GetNextToken(); token == "" {
			return all
		}
	}
}

// TestCapMessage: a health message stays within the API's 1024 bytes, cut at a rune.
func TestCapMessage(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"Short", "member 1 Failed"},
		{"Exact", strings.Repeat("a", MaxHealthMessage)},
		{"Long", strings.Repeat("a", 3000)},
		{"LongMultibyte", strings.Repeat("é", 1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := capMessage(tc.in)
			if len(got) > MaxHealthMessage || !utf8.ValidString(got) {
				t.Fatalf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
			if len(tc.in) <= MaxHealthMessage && got != tc.in {
				t.Fatalf("a message within the limit was changed: %q", got)
			}
			if len(tc.in) > MaxHealthMessage && !strings.HasSuffix(got, "...") {
				t.Fatalf("a cut message does not end in ...: %q", got[len(got)-8:])
			}
		})
	}
}
