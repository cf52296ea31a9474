package perf

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	utilexec "k8s.io/utils/exec"

	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

func init() {
	register(frontend{name: "nbd+crypt", order: 15, attach: attachNBDCrypt, paired: "nbd (paired)"})
}

// attachNBDCrypt serves the array over NBD as attachNBD does and puts a dm-crypt LUKS2
// mapping over the device as the node plugin does for an encrypted volume (pkg/crypt:
// cryptsetup's cipher, AES-XTS 512-bit, 4 KiB sectors on the NBD device's 4 KiB blocks):
// fio runs on the mapping, and each case first on the NBD device under it (the paired rows,
// "nbd (paired)"), so the pair is the cost of encryption on the same array, measured a
// minute apart at most. The plain runs write over the mapping's header and data: the open
// mapping keeps its key in the kernel, and nothing is read back for its content. The key derivation is the cheap one of the tests (it is
// paid once, at the open, not per I/O).
func attachNBDCrypt(t *testing.T, arr *raid10.Array) (*attached, error) {
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		return nil, fmt.Errorf("%w: no cryptsetup: %w", errUnavailable, err)
	}
	a, err := attachNBD(t, arr)
	if err != nil {
		return nil, err
	}
	// The array is the benchmark's own, made for this frontend: blank by construction.
	blank := func(string) (string, error) { return "", nil }
	c := crypt.New(utilexec.New(), blank, crypt.Options{PBKDF: crypt.PBKDFPBKDF2, ForceIterations: 1000})
	ctx, key, name := context.Background(), []byte("perf-key"), crypt.MapperName("perf")
	if err := c.Format(ctx, a.dev, key); err != nil {
		_ = a.detach()
		return nil, err
	}
	mapped, err := c.Open(ctx, a.dev, name, key)
	if err != nil {
		_ = a.detach()
		return nil, err
	}
	if out, err := exec.Command("cryptsetup", "status", name).CombinedOutput(); err == nil {
		t.Logf("nbd+crypt: %s over %s:\n%s", mapped, a.dev, out)
	}
	return &attached{
		dev:      mapped,
		plain:    a.dev,
		requests: a.requests,
		detach: func() error {
			if err := c.Close(ctx, name); err != nil {
				return err
			}
			return a.detach()
		},
	}, nil
}
