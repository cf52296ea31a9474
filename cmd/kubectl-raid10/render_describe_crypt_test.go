package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
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

// TestVolumesEncryptedColumn: both modes' volume tables say which volumes are encrypted.
// Cluster mode from the Raid10Volume (yes/no); local mode from this node's dm-crypt
// mappings (open while one is active for the volume, else "-").
func TestVolumesEncryptedColumn(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		enc, byStatus, plain := v1alpha1.Raid10Volume{}, v1alpha1.Raid10Volume{}, v1alpha1.Raid10Volume{}
		enc.Name, enc.Annotations, plain.Name = "vol-enc", map[string]string{v1alpha1.EncryptedAnnotation: "true"}, "vol-plain"
		byStatus.Name, byStatus.Status.Encrypted = "vol-status", true
		var b bytes.Buffer
		if err := (renderer{o: &Options{Output: "table"}, w: &b}).clusterVolumes([]v1alpha1.Raid10Volume{enc, byStatus, plain}, time.Now()); err != nil {
			t.Fatal(err)
		}
		t.Logf("volumes:\n%s", b.String())
		for _, name := range []string{"vol-enc", "vol-status"} {
			if got := columnOf(t, b.String(), "ENCRYPTED", name); got != "yes" {
				t.Errorf("%s: ENCRYPTED %q, want yes", name, got)
			}
		}
		if got := columnOf(t, b.String(), "ENCRYPTED", "vol-plain"); got != "no" {
			t.Errorf("vol-plain: ENCRYPTED %q, want no", got)
		}
	})
	t.Run("local", func(t *testing.T) {
		dir := t.TempDir()
		if err := syscall.Mknod(filepath.Join(dir, crypt.MapperName("vol-enc")), syscall.S_IFCHR|0o600, 1<<8|3); err != nil {
			t.Skipf("mknod (needs root): %v", err)
		}
		var b bytes.Buffer
		vs := []pool.VolumeInfo{{Name: "vol-enc", Size: 1 << 30, Health: pool.Healthy}, {Name: "vol-plain", Size: 1 << 30, Health: pool.Healthy}}
		if err := (renderer{o: &Options{Output: "table", RunDir: t.TempDir(), MapperDir: dir}, w: &b}).volumes(vs); err != nil {
			t.Fatal(err)
		}
		t.Logf("volumes:\n%s", b.String())
		if got := columnOf(t, b.String(), "ENCRYPTED", "vol-enc"); got != "open" {
			t.Errorf("vol-enc: ENCRYPTED %q, want open", got)
		}
		if got := columnOf(t, b.String(), "ENCRYPTED", "vol-plain"); got != "-" {
			t.Errorf("vol-plain: ENCRYPTED %q, want -", got)
		}
	})
}

// columnOf is the cell of the table out under the header column in the row of name (the
// header's start position, as tabwriter aligns it).
func columnOf(t *testing.T, out, column, name string) string {
	t.Helper()
	header := lineOf(out, "NAME ")
	at := strings.Index(header, column)
	row := lineOf(out, name+" ")
	if at < 0 || len(row) <= at {
		t.Fatalf("no column %s or no row %s in:\n%s", column, name, out)
	}
	return strings.Fields(row[at:])[0]
}
