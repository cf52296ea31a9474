package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/crypt"
)

// Encryption at rest (docs/design.md, "Encryption at rest"): a volume whose StorageClass
// says encrypted: "true" is staged on a dm-crypt LUKS2 mapping over its served device. The
// key is the field SecretKeyField of the Secret that the StorageClass names with
// csi.storage.k8s.io/node-stage-secret-name and -namespace; the kubelet passes it in
// NodeStageVolume's secrets. It is the passphrase of a keyslot of the header, which wraps
// the volume key cryptsetup made at random. A Secret that also carries the field
// SecretPreviousKeyField rotates the header to the key at the next stage (rotateKey): the
// volume key and the data stay as they are.

// SecretKeyField is the field of the node-stage Secret that holds an encrypted volume's key.
const SecretKeyField = "key"

// SecretPreviousKeyField is the field of the node-stage Secret that holds the key being
// rotated away from (docs/operations.md, "Rotating an encryption key"): when the header
// does not know the key yet, NodeStageVolume gives the key a keyslot unlocked by this one
// and then wipes this one's keyslot. Leave it out once every volume has been staged.
const SecretPreviousKeyField = "previousKey"

// parseEncrypted reads the value of ParamEncrypted.
func parseEncrypted(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("parameter %s=%q: must be true or false: %w", ParamEncrypted, v, ErrInvalidArgument)
	}
	return b, nil
}

// withEncrypted adds ParamEncrypted to a created volume's context when its parameters ask
// for encryption: NodeStageVolume reads it there.
func withEncrypted(vc map[string]string, p volumeParams) map[string]string {
	if !p.encrypted {
		return vc
	}
	if vc == nil {
		vc = map[string]string{}
	}
	vc[ParamEncrypted] = "true"
	return vc
}

// encryptedAnnotation is the value of v1alpha1.EncryptedAnnotation for a new volume: "true"
// or "" (no annotation).
func encryptedAnnotation(p volumeParams) string {
	if p.encrypted {
		return "true"
	}
	return ""
}

// isEncrypted reports whether a volume context asks for encryption at rest.
func isEncrypted(vc map[string]string) bool {
	b, err := strconv.ParseBool(vc[ParamEncrypted])
	return err == nil && b
}

// cryptsetup is the node's LUKS2 tool: the node's exec, and its blkid check before mkfs
// (GetDiskFormat) as the proof that a device is blank before it gets a header.
func (n *NodeServer) cryptsetup() *crypt.Cryptsetup {
	return crypt.New(n.mounter.Exec, n.mounter.GetDiskFormat, n.cryptOpts)
}

// openEncrypted returns the device to stage volume id on: dev itself for a volume that is
// not encrypted; for an encrypted one its LUKS2 mapping over dev, opened with the key of
// the node-stage secrets, after a LUKS2 header is written if dev is blank, and after the
// header is rotated from the secrets' previous key to the key if they have one. A missing key is
// InvalidArgument; a wrong key, or a device that holds data without a LUKS header, is
// FailedPrecondition naming the volume, and nothing is written on the device.
func (n *NodeServer) openEncrypted(ctx context.Context, id, dev string, vc, secrets map[string]string) (string, error) {
	if !isEncrypted(vc) {
		return dev, nil
	}
	key := secrets[SecretKeyField]
	if key == "" {
		what := fmt.Sprintf("no field %q", SecretKeyField)
		if len(secrets) == 0 {
			what = "no secret at all (the StorageClass must name one with csi.storage.k8s.io/node-stage-secret-name and csi.storage.k8s.io/node-stage-secret-namespace)"
		}
		return "", fmt.Errorf("volume %q is encrypted but the node-stage secret has %s: %w", id, what, ErrInvalidArgument)
	}
	cs, name := n.cryptsetup(), crypt.MapperName(id)
	if err := rotateKey(ctx, cs, id, dev, key, secrets[SecretPreviousKeyField]); err != nil {
		return "", err
	}
	path, err := cs.Open(ctx, dev, name, []byte(key))
	formatted := false
	if errors.Is(err, crypt.ErrNotLUKS) {
		if err = cs.Format(ctx, dev, []byte(key)); err == nil {
			formatted = true
			path, err = cs.Open(ctx, dev, name, []byte(key))
		}
	}
	switch {
	case errors.Is(err, crypt.ErrWrongKey), errors.Is(err, crypt.ErrNotBlank), errors.Is(err, crypt.ErrMappedElsewhere):
		return "", fmt.Errorf("volume %q: %w: %w", id, err, ErrFailedPrecondition)
	case err != nil:
		return "", fmt.Errorf("volume %q: encryption: %w", id, err)
	}
	klog.FromContext(ctx).Info("Encrypted volume opened", "device", dev, "mapping", path, "formatted", formatted)
	return path, nil
}

// stagedDevice returns the LUKS2 mapping of volume id when one is open, dev otherwise: the
// device whose mounts NodeUnstageVolume must look for.
func (n *NodeServer) stagedDevice(id, dev string) string {
	cs, name := n.cryptsetup(), crypt.MapperName(id)
	if cs.IsOpen(name) {
		return cs.Path(name)
	}
	return dev
}

// publishedDevice returns the device to bind for a Block volume: dev, or the open LUKS2
// mapping of an encrypted volume. An encrypted volume whose mapping is not open (not staged)
// is FailedPrecondition: binding the ciphertext device would let a pod overwrite the header.
func (n *NodeServer) publishedDevice(id, dev string, vc map[string]string) (string, error) {
	cs, name := n.cryptsetup(), crypt.MapperName(id)
	switch {
	case cs.IsOpen(name):
		return cs.Path(name), nil
	case isEncrypted(vc):
		return "", fmt.Errorf("volume %q is encrypted and its mapping %s is not open: stage it first: %w", id, cs.Path(name), ErrFailedPrecondition)
	}
	return dev, nil
}

// closeEncrypted removes the LUKS2 mapping of volume id, if one is open, before its device
// is detached. A mapping still in use fails (cryptsetup refuses), and the device stays.
func (n *NodeServer) closeEncrypted(ctx context.Context, id string) error {
	name := crypt.MapperName(id)
	if err := n.cryptsetup().Close(ctx, name); err != nil {
		return fmt.Errorf("volume %q: close its encryption mapping: %w", id, err)
	}
	return nil
}

// resizeEncrypted grows the open LUKS2 mapping of volume id to its grown device; nothing
// for a volume without one.
func (n *NodeServer) resizeEncrypted(ctx context.Context, id string) error {
	cs, name := n.cryptsetup(), crypt.MapperName(id)
	if !cs.IsOpen(name) {
		return nil
	}
	if err := cs.Resize(ctx, name); err != nil {
		return fmt.Errorf("volume %q: grow its encryption mapping: %w", id, err)
	}
	return nil
}

// rotateKey rotates the header of volume id on dev from the key previous to key when the
// node-stage secret has both (crypt.Rotate): the key gets a keyslot unlocked by previous,
// then previous's keyslot is wiped; the volume key and the data stay. Nothing is done
// without a previous key, with one equal to the key, or on a device without a header (a
// blank one gets its header from the key). Neither key opening the header is
// FailedPrecondition naming the volume, with nothing written. A rotation is logged with
// the keyslots it changed.
func rotateKey(ctx context.Context, cs *crypt.Cryptsetup, id, dev, key, previous string) error {
	if previous == "" || previous == key {
		return nil
	}
	res, err := cs.Rotate(ctx, dev, []byte(key), []byte(previous))
	switch {
	case errors.Is(err, crypt.ErrNotLUKS):
		return nil
	case errors.Is(err, crypt.ErrWrongKey):
		return fmt.Errorf("volume %q: neither the node-stage secret's %q nor its %q opens the header: %w: %w",
			id, SecretKeyField, SecretPreviousKeyField, err, ErrFailedPrecondition)
	case err != nil:
		return fmt.Errorf("volume %q: rotate its encryption key: %w", id, err)
	}
	if res.Rotation != crypt.RotationNone {
		klog.FromContext(ctx).Info("Encryption key rotated", "volumeID", id, "device", dev,
			"rotation", res.Rotation.String(), "keySlot", res.KeySlot, "wipedKeySlot", res.Wiped)
	}
	return nil
}
