package main

import (
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
)

// encrypted reports whether the volume's StorageClass asked for encryption at rest: the
// annotation the controller writes at creation, or the status field the node agent copies
// it into.
func encrypted(v *v1alpha1.Raid10Volume) bool {
	return v.Annotations[v1alpha1.EncryptedAnnotation] == "true" || v.Status.Encrypted
}

// encryptedColumn is the ENCRYPTED column of cluster mode: yes or no.
func encryptedColumn(v *v1alpha1.Raid10Volume) string {
	if encrypted(v) {
		return "yes"
	}
	return "no"
}

// localEncryptedColumn is the ENCRYPTED column of local mode: "open" while the volume's
// dm-crypt mapping is active on this node (it is staged encrypted), else "-". The pool does
// not know a volume's StorageClass, so an encrypted volume that is not staged shows "-";
// cluster mode says it from the Raid10Volume.
func localEncryptedColumn(o *Options, volume string) string {
	if crypt.VolumeOpen(o.MapperDir, volume) {
		return "open"
	}
	return "-"
}
