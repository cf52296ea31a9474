// Package crypt puts a volume's block device under dm-crypt with a LUKS2 header, through
// the cryptsetup binary (Debian package cryptsetup-bin): the node plugin stages an
// encrypted volume on the mapping (/dev/mapper/<name>) instead of the served device
// (/dev/nbdX, /dev/ublkbN), so the member disks only ever hold ciphertext.
//
// Keys: LUKS2 makes a random volume key when it formats the device (the key that encrypts
// the data); the caller's key is the passphrase of keyslot 0, which wraps that volume key.
// Rotate makes a new passphrase take the place of the previous one: a keyslot for the new
// one (luksAddKey, unlocked by the previous one), then the previous one's keyslot wiped
// (luksKillSlot); the volume key and the data stay as they are, and a crash between the two
// steps leaves a header that opens with either passphrase (rotate.go). Keys travel to
// cryptsetup on its standard input (--key-file=-), never on its command line (visible in
// /proc) or in a file.
//
// Safety: Format writes a header only on a device that carries no LUKS header and no other
// signature (the caller's Probe, the same blkid check that guards mkfs); a device holding
// anything else is refused with ErrNotBlank and left untouched. A key that opens no keyslot
// is ErrWrongKey (cryptsetup's exit status 2), and nothing is written on the device then.
// Open asks cryptsetup not to keep the volume key in the kernel keyring (--disable-keyring)
// so that Resize, run for an online expansion, needs no key.
//
// The package imports no CSI and no Kubernetes API types; it runs commands through
// k8s.io/utils/exec so that tests can fake them.
package crypt
