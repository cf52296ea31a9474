package agent

import "testing"

func TestFrontendOf(t *testing.T) {
	for dev, want := range map[string]string{
		"/dev/nbd0": "nbd", "/dev/nbd15": "nbd", "/dev/ublkb3": "ublk", "": "", "/dev/sda": "",
	} {
		if got := frontendOf(dev); got != want {
			t.Errorf("frontendOf(%q) = %q, want %q", dev, got, want)
		}
	}
}
