package pool

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestMemberTimeoutConfig: memberTimeout reads as a duration string or seconds, is
// validated against the kernel's NBD request timeout, and reaches the engine's options.
func TestMemberTimeoutConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		json    string
		want    time.Duration
		invalid bool // Validate fails with ErrInvalidArgument
		parse   bool // LoadConfig fails to decode it
	}{
		{name: "absent: the engine's default", json: `{}`, want: 0},
		{name: "duration string", json: `{"memberTimeout": "1500ms"}`, want: 1500 * time.Millisecond},
		{name: "seconds", json: `{"memberTimeout": 3}`, want: 3 * time.Second},
		{name: "fractional seconds", json: `{"memberTimeout": 0.25}`, want: 250 * time.Millisecond},
		{name: "negative: off", json: `{"memberTimeout": "-1s"}`, want: -time.Second},
		{name: "just below the limit", json: `{"memberTimeout": "` + (MaxMemberTimeout - time.Millisecond).String() + `"}`, want: MaxMemberTimeout - time.Millisecond},
		{name: "at the limit", json: `{"memberTimeout": "` + MaxMemberTimeout.String() + `"}`, want: MaxMemberTimeout, invalid: true},
		{name: "the kernel's timeout itself", json: `{"memberTimeout": "` + kernel.DefaultTimeout.String() + `"}`, want: kernel.DefaultTimeout, invalid: true},
		{name: "not a duration", json: `{"memberTimeout": "soon"}`, parse: true},
		{name: "wrong type", json: `{"memberTimeout": true}`, parse: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "pool.json")
			if err := os.WriteFile(path, []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := LoadConfig(path)
			if tc.parse {
				if !errors.Is(err, ErrInvalidArgument) {
					t.Fatalf("LoadConfig: %v, want ErrInvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(c.MemberTimeout); got != tc.want {
				t.Fatalf("memberTimeout %s, want %s", got, tc.want)
			}
			err = c.Validate()
			if tc.invalid != errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("Validate: %v, invalid %v", err, tc.invalid)
			}
			if got := (&Pool{cfg: c}).engineOptions().MemberTimeout; got != tc.want {
				t.Fatalf("engine options: member timeout %s, want %s", got, tc.want)
			}
		})
	}
	if MaxMemberTimeout <= 0 || MaxMemberTimeout >= kernel.DefaultTimeout || raid10.DefaultMemberTimeout >= MaxMemberTimeout {
		t.Fatalf("MaxMemberTimeout %s with the kernel's request timeout %s and the engine's default %s",
			MaxMemberTimeout, kernel.DefaultTimeout, raid10.DefaultMemberTimeout)
	}
	// It writes back as a duration string, which reads back the same.
	b, err := json.Marshal(Config{MemberTimeout: Duration(2500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil || c.MemberTimeout != Duration(2500*time.Millisecond) {
		t.Fatalf("round trip %s: %v %v", b, c.MemberTimeout, err)
	}
}
