package blockdev

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

func TestErrno(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"nil", nil, 0},
		{"wrapped ENOSPC", &os.PathError{Op: "write", Err: syscall.ENOSPC}, syscall.ENOSPC},
		{"EINVAL", fmt.Errorf("raid10: misaligned: %w", syscall.EINVAL), syscall.EINVAL},
		{"EPERM", syscall.EPERM, syscall.EPERM},
		{"EROFS", syscall.EROFS, syscall.EROFS},
		{"EOPNOTSUPP", syscall.EOPNOTSUPP, syscall.EOPNOTSUPP},
		{"other errno", syscall.EBADMSG, syscall.EIO},
		{"text is not matched", errors.New("no space left on device"), syscall.EIO},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Errno(tc.err); got != tc.want {
				t.Fatalf("Errno(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
