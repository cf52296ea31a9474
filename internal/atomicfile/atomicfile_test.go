package atomicfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// leftovers lists the temporary files Write left in dir.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var tmps []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			tmps = append(tmps, e.Name())
		}
	}
	return tmps
}

func TestWrite(t *testing.T) {
	long := bytes.Repeat([]byte("old content, longer than the new one\n"), 100)
	tests := []struct {
		name    string
		before  []byte      // nil: no file before
		mode    os.FileMode // mode of the file before
		data    []byte
		wantErr bool
	}{
		{name: "new file", data: []byte("new\n")},
		{name: "longer file replaced whole", before: long, mode: 0o600, data: []byte("short\n")},
		{name: "empty data", before: long, mode: 0o600, data: []byte{}},
		{name: "mode 0600 also over a 0644 file", before: []byte("x"), mode: 0o644, data: []byte("y")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.json")
			if tc.before != nil {
				if err := os.WriteFile(path, tc.before, tc.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tc.mode); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			if err := Write(path, tc.data); err != nil {
				t.Fatalf("Write: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.data) {
				t.Errorf("content %q, want %q", got, tc.data)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if m := fi.Mode().Perm(); m != 0o600 {
				t.Errorf("mode %v, want 0600", m)
			}
			if tmps := leftovers(t, dir); len(tmps) > 0 {
				t.Errorf("temporary files left: %v", tmps)
			}
		})
	}
}

// TestWriteErrorRemovesTemp makes the rename fail (the target is a directory that is not
// empty): the temporary file must be gone and the target untouched.
func TestWriteErrorRemovesTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(path, "keep")
	if err := os.WriteFile(inside, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new")); err == nil {
		t.Fatal("Write over a non-empty directory succeeded")
	}
	if tmps := leftovers(t, dir); len(tmps) > 0 {
		t.Errorf("temporary files left after the error: %v", tmps)
	}
	if got, err := os.ReadFile(inside); err != nil || string(got) != "kept" {
		t.Errorf("target changed: %q, %v", got, err)
	}
}

// TestWriteMissingDir fails before any temporary file exists, with the cause wrapped.
func TestWriteMissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "state.json")
	if err := Write(path, []byte("x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Write into a missing directory: %v, want fs.ErrNotExist", err)
	}
}
