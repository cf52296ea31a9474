package driver

import (
	"errors"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func TestParseParams(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      map[string]string
		members int32
		chunk   int64
		bad     string // the parameter the error must name
	}{
		{name: "Defaults", members: DefaultMembers, chunk: DefaultChunkSizeBytes},
		{name: "Set", in: map[string]string{ParamMembers: "6", ParamChunkSize: "64Ki"}, members: 6, chunk: 64 << 10},
		{name: "ExtraMetadata", in: map[string]string{paramPVCName: "a", paramPVCNamespace: "b", paramPVName: "c"}, members: DefaultMembers, chunk: DefaultChunkSizeBytes},
		{name: "OddMembers", in: map[string]string{ParamMembers: "5"}, bad: ParamMembers},
		{name: "TooManyMembers", in: map[string]string{ParamMembers: "34"}, bad: ParamMembers},
		{name: "MembersNotANumber", in: map[string]string{ParamMembers: "four"}, bad: ParamMembers},
		{name: "ChunkNotPowerOfTwo", in: map[string]string{ParamChunkSize: "96Ki"}, bad: ParamChunkSize},
		{name: "ChunkTooSmall", in: map[string]string{ParamChunkSize: "2Ki"}, bad: ParamChunkSize},
		{name: "ChunkGarbage", in: map[string]string{ParamChunkSize: "big"}, bad: ParamChunkSize},
		{name: "FrontendUblk", in: map[string]string{ParamFrontend: "ublk"}, members: DefaultMembers, chunk: DefaultChunkSizeBytes},
		{name: "FrontendUnknown", in: map[string]string{ParamFrontend: "iscsi"}, bad: ParamFrontend},
		{name: "Unknown", in: map[string]string{"csi.storage.k8s.io/fstype": "ext4"}, bad: "csi.storage.k8s.io/fstype"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parseParams(tc.in)
			if tc.bad != "" {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.bad)
				}
				return
			}
			if err != nil || p.layout.Members != tc.members || p.layout.ChunkSizeBytes != tc.chunk {
				t.Fatalf("parseParams = %+v, %v", p, err)
			}
		})
	}
}

func TestParseCapabilities(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps []*csi.VolumeCapability
		want volumeShape
		bad  bool
	}{
		{name: "DefaultFS", caps: []*csi.VolumeCapability{mountCap("")}, want: volumeShape{v1alpha1.VolumeModeFilesystem, v1alpha1.FSTypeExt4}},
		{name: "XFS", caps: []*csi.VolumeCapability{mountCap("xfs")}, want: volumeShape{v1alpha1.VolumeModeFilesystem, v1alpha1.FSTypeXFS}},
		{name: "Block", caps: []*csi.VolumeCapability{blockCap()}, want: volumeShape{mode: v1alpha1.VolumeModeBlock}},
		{name: "Empty", bad: true},
		{name: "Mixed", caps: []*csi.VolumeCapability{blockCap(), mountCap("")}, bad: true},
		{name: "NoAccessMode", caps: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}}, bad: true},
		{name: "ReadOnlyMany", caps: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
		}}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCapabilities(tc.caps)
			if tc.bad {
				if !errors.Is(err, ErrInvalidArgument) {
					t.Fatalf("err = %v, want InvalidArgument", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseCapabilities = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestRequestedSize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		req, lim int64
		want     int64
		err      error
	}{
		{name: "Default", want: DefaultVolumeSize},
		{name: "DefaultCappedByLimit", lim: 10 << 20, want: 10 << 20},
		{name: "RoundedUp", req: 1, want: SizeAlignment},
		{name: "Exact", req: 5 << 20, lim: 5 << 20, want: 5 << 20},
		{name: "RoundingExceedsLimit", req: 1, lim: 1000, err: ErrOutOfRange},
		{name: "Inverted", req: 2 << 20, lim: 1 << 20, err: ErrOutOfRange},
		{name: "Negative", req: -1, err: ErrOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := requestedSize(&csi.CapacityRange{RequiredBytes: tc.req, LimitBytes: tc.lim})
			if !errors.Is(err, tc.err) || (tc.err == nil && got != tc.want) {
				t.Fatalf("requestedSize = %d, %v; want %d, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestVolumeID(t *testing.T) {
	if got := volumeID("pvc-1234"); got != "pvc-1234" {
		t.Errorf("volumeID(pvc-1234) = %s", got)
	}
	odd := volumeID("Sanity Volume/1")
	if !strings.HasPrefix(odd, "r10v-") || odd != volumeID("Sanity Volume/1") || odd == volumeID("Sanity Volume/2") {
		t.Errorf("volumeID of an invalid name = %s, want a stable r10v- hash", odd)
	}
	// A valid object name longer than a pool volume name (csi-sanity's maximum-length name).
	long := strings.Repeat("a", 128)
	if got := volumeID(long); !strings.HasPrefix(got, "r10v-") || pool.ValidateName(got) != nil {
		t.Errorf("volumeID of a 128-byte name = %s, want an r10v- hash the pool accepts", got)
	}
}

func TestStripSecrets(t *testing.T) {
	req := &csi.CreateVolumeRequest{Name: "v", Secrets: map[string]string{"password": "hunter2"}}
	got := stripSecrets(req).(*csi.CreateVolumeRequest)
	if len(got.GetSecrets()) != 0 || got.GetName() != "v" || len(req.GetSecrets()) != 1 {
		t.Fatalf("stripSecrets = %v (original %v)", got, req)
	}
}

func TestCodeOf(t *testing.T) {
	for err, want := range map[error]string{
		ErrInvalidArgument:      "InvalidArgument",
		ErrNotFound:             "NotFound",
		ErrAlreadyExists:        "AlreadyExists",
		ErrOperationInFlight:    "Aborted",
		ErrInsufficientCapacity: "ResourceExhausted",
		ErrOutOfRange:           "OutOfRange",
		ErrNotReady:             "DeadlineExceeded",
		ErrFailedPrecondition:   "FailedPrecondition",
		// The pool refuses to serve a clone whose copy failed, or to delete the only
		// holder of a stopped copy's data.
		pool.ErrFailedPrecondition: "FailedPrecondition",
		ErrUnimplemented:           "Unimplemented",
		errors.New("boom"):         "Internal",
	} {
		if got := codeOf(errors.Join(errors.New("context"), err)).String(); got != want {
			t.Errorf("codeOf(%v) = %s, want %s", err, got, want)
		}
	}
}
