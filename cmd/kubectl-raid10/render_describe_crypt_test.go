package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestDescribeEncryption: describe says whether a volume is encrypted at rest, from the
// annotation the controller writes.
func TestDescribeEncryption(t *testing.T) {
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        string
	}{
		{"encrypted", map[string]string{v1alpha1.EncryptedAnnotation: "true"}, "  Encryption:  LUKS2 (dm-crypt on the node; key from the node-stage Secret)\n"},
		{"plain", nil, "  Encryption:  none\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &v1alpha1.Raid10Volume{}
			v.Name, v.Annotations = "vol-1", tc.annotations
			var b bytes.Buffer
			describeSpec(&errWriter{w: &b}, v, time.Now())
			if !strings.Contains(b.String(), tc.want) {
				t.Fatalf("describe:\n%s\nwant the line %q", b.String(), tc.want)
			}
		})
	}
}
