package driver

import (
	"fmt"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// sameEncryption refuses, with ErrAlreadyExists, a repeated CreateVolume whose encrypted
// parameter differs from the existing volume's (v1alpha1.EncryptedAnnotation): the same name
// with other parameters. Volumes made before the parameter existed have no annotation and
// are not encrypted.
func sameEncryption(vol *v1alpha1.Raid10Volume, p volumeParams) error {
	has := vol.Annotations[v1alpha1.EncryptedAnnotation] == "true"
	if has != p.encrypted {
		return fmt.Errorf("volume %q exists with %s=%t, %t was asked for: %w", vol.Name, ParamEncrypted, has, p.encrypted, ErrAlreadyExists)
	}
	return nil
}
