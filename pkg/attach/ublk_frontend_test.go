package attach

import (
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/ublk"
)

// TestUblkFrontendZeroCopy: a zero-copy ublk device says so in its frontend, inside the
// parentheses that follow "ublk" (what the status readers look for stays a prefix).
func TestUblkFrontendZeroCopy(t *testing.T) {
	for _, tc := range []struct {
		feat ublk.Flags
		zc   bool
		want string
	}{
		{0x1fffff, true, "ublk (SUPPORT_ZERO_COPY, UPDATE_SIZE, AUTO_BUF_REG, PER_IO_DAEMON, BATCH_IO; zero copy)"},
		{0x1fffff, false, "ublk (SUPPORT_ZERO_COPY, UPDATE_SIZE, AUTO_BUF_REG, PER_IO_DAEMON, BATCH_IO)"},
		{0x1fe, false, "ublk"},
	} {
		if got := ublkFrontend(tc.feat, tc.zc); got != tc.want {
			t.Errorf("ublkFrontend(%s, %v) = %q, want %q", tc.feat, tc.zc, got, tc.want)
		}
	}
}
