package kernel

import (
	"os"
	"path/filepath"
	"testing"
)

func TestStateRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nbd-state.json")
	s, err := OpenState(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("vol-a", Record{Index: 3, BackendID: BackendID("vol-a"), Export: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("vol-b", Record{Index: 5, BackendID: BackendID("vol-b")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("vol-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("never-there"); err != nil {
		t.Fatalf("deleting a missing volume: %v", err)
	}
	again, err := OpenState(path)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := again.Get("vol-a")
	if !ok || r.Index != 3 || r.BackendID != "raid10-csi:vol-a" || r.Export != "a" {
		t.Fatalf("reloaded %+v %v", r, ok)
	}
	if _, ok := again.Get("vol-b"); ok {
		t.Fatal("deleted volume came back")
	}
	// No temporary files are left next to the state.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries", len(ents))
	}
}

func TestStateRefusesUnknownVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.json")
	cases := []struct{ name, content string }{
		{"future version", `{"version": 2, "devices": {}}`},
		{"garbage", `{"version": 1, "devi`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := OpenState(path); err == nil {
				t.Fatal("opened")
			}
		})
	}
}

func TestStateWriteFailureKeepsMemory(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenState(filepath.Join(dir, "missing-dir", "s.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("v", Record{Index: 1}); err == nil {
		t.Fatal("Put into a missing directory succeeded")
	}
	if _, ok := s.Get("v"); ok {
		t.Fatal("a record that was not written is visible")
	}
}
