// Package skipper is a fixture for hack/skipcheck's test: run through hack/test.sh, its
// test skips when SKIPCHECK_FIXTURE says so, as a test that is not on the allow-list.
package skipper

import (
	"os"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

func TestMaybeSkips(t *testing.T) {
	switch os.Getenv("SKIPCHECK_FIXTURE") {
	case "heavy":
		testenv.Skip(t, testenv.KindHeavy, "fixture: a heavy skip nobody allowed")
	case "plain":
		t.Skip("fixture: a skip without internal/testenv")
	}
}
