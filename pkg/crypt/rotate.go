package crypt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// Key rotation rewraps the volume key under a new passphrase and rewrites no data: the
// volume key, which encrypts every sector, stays; only the keyslots that wrap it change.
//
// The order makes it safe against a crash at any point: the new passphrase gets a keyslot
// of its own first (luksAddKey, unlocked by the previous passphrase), and only then is the
// previous passphrase's keyslot wiped (luksKillSlot). Cut between the two, the header opens
// with either passphrase, and the next Rotate finds the new one's keyslot and finishes by
// wiping the old one. cryptsetup writes each change of a LUKS2 header as a whole (the JSON
// metadata twice, with a sequence number), so a cut inside a step leaves that step done or
// not done, never half done.

// Rotation says what Rotate did.
type Rotation int

const (
	// RotationNone means the key has its keyslot and the previous key opens none (the usual
	// case once a rotation is over). Nothing was written.
	RotationNone Rotation = iota
	// RotationRotated means the key got a keyslot (unlocked by the previous key) and the previous
	// key's keyslot was wiped.
	RotationRotated
	// RotationFinished means the key had its keyslot already and the previous key still opened
	// another one, left by a rotation cut between its two steps; that keyslot was wiped.
	RotationFinished
)

// String names the rotation as the node logs it.
func (r Rotation) String() string {
	switch r {
	case RotationNone:
		return "none"
	case RotationRotated:
		return "rotated"
	case RotationFinished:
		return "finished"
	}
	return "Rotation(" + strconv.Itoa(int(r)) + ")"
}

// RotateResult is what Rotate did and to which keyslots.
type RotateResult struct {
	// Rotation is what was done.
	Rotation Rotation
	// KeySlot is the keyslot the key opens (after the rotation).
	KeySlot int
	// Wiped is the keyslot of the previous key that was wiped, -1 for none.
	Wiped int
}

// maxKeyslots is the number of keyslots a LUKS2 header has room for.
const maxKeyslots = 32

// Rotate makes key the passphrase of dev's LUKS2 header in place of previous, without
// writing data: when key opens no keyslot, a keyslot for key is added, unlocked by
// previous (its key derivation from the Options, as for a new header), and previous's
// keyslot is then wiped; when key opens one already, a keyslot that previous still opens
// is wiped (a rotation cut short). Neither key opening any keyslot is ErrWrongKey, with
// nothing written; a device without a LUKS header is ErrNotLUKS. previous equal to key is
// refused (ErrSameKey): wiping its keyslot would wipe the key's. Keys go to cryptsetup on
// its standard input only. A keyslot of neither key (an operator's recovery passphrase)
// stays as it is. dev may be open (mapped) meanwhile: the mapping keeps the volume key.
func (c *Cryptsetup) Rotate(ctx context.Context, dev string, key, previous []byte) (RotateResult, error) {
	res := RotateResult{Rotation: RotationNone, KeySlot: -1, Wiped: -1}
	switch {
	case len(key) == 0 || len(previous) == 0:
		return res, ErrEmptyKey
	case bytes.Equal(key, previous):
		return res, ErrSameKey
	}
	slots, err := c.Keyslots(ctx, dev)
	if err != nil {
		return res, err
	}
	if res.KeySlot, err = c.slotOf(ctx, dev, key, slots); err != nil {
		return res, err
	}
	if res.KeySlot < 0 {
		if res.KeySlot, err = c.addKey(ctx, dev, previous, key, slots); err != nil {
			return res, err
		}
		res.Rotation = RotationRotated
	}
	others := slices.DeleteFunc(slices.Clone(slots), func(s int) bool { return s == res.KeySlot })
	prevSlot, err := c.slotOf(ctx, dev, previous, others)
	if err != nil || prevSlot < 0 {
		return res, err
	}
	if out, _, err := c.run(ctx, nil, "luksKillSlot", "--batch-mode", dev, strconv.Itoa(prevSlot)); err != nil {
		return res, cmdError(fmt.Sprintf("luksKillSlot %s %d", dev, prevSlot), out, err)
	}
	res.Wiped = prevSlot
	if res.Rotation == RotationNone {
		res.Rotation = RotationFinished
	}
	return res, nil
}

// Keyslots returns the numbers of dev's active LUKS2 keyslots, in ascending order, from
// the header's JSON metadata (luksDump, which derives no key). A device without a LUKS
// header is ErrNotLUKS.
func (c *Cryptsetup) Keyslots(ctx context.Context, dev string) ([]int, error) {
	luks, err := c.IsLUKS(ctx, dev)
	if err != nil {
		return nil, err
	}
	if !luks {
		return nil, fmt.Errorf("%s: %w", dev, ErrNotLUKS)
	}
	out, _, err := c.run(ctx, nil, "luksDump", "--dump-json-metadata", dev)
	if err != nil {
		return nil, cmdError("luksDump "+dev, out, err)
	}
	var md struct {
		Keyslots map[string]struct {
			Type string `json:"type"`
		} `json:"keyslots"`
	}
	if err := json.Unmarshal(out, &md); err != nil {
		return nil, fmt.Errorf("crypt: luksDump %s: its JSON metadata: %w", dev, err)
	}
	var slots []int
	for k, ks := range md.Keyslots {
		n, err := strconv.Atoi(k)
		if err != nil || n < 0 || n >= maxKeyslots {
			return nil, fmt.Errorf("crypt: luksDump %s: keyslot %q: not a number below %d", dev, k, maxKeyslots)
		}
		if ks.Type == "luks2" { // not a reencryption slot, which wraps no passphrase
			slots = append(slots, n)
		}
	}
	slices.Sort(slots)
	return slots, nil
}

// slotOf returns the first of slots that key opens (cryptsetup open --test-passphrase
// --key-slot, which maps nothing), -1 when it opens none of them. Each slot tried costs
// one key derivation.
func (c *Cryptsetup) slotOf(ctx context.Context, dev string, key []byte, slots []int) (int, error) {
	for _, s := range slots {
		out, code, err := c.run(ctx, key, "open", "--test-passphrase", "--type", "luks2", "--key-file=-",
			"--key-slot", strconv.Itoa(s), dev)
		switch {
		case err == nil:
			return s, nil
		case code != exitWrongKey:
			return -1, cmdError(fmt.Sprintf("open --test-passphrase %s (keyslot %d)", dev, s), out, err)
		}
	}
	return -1, nil
}

// addKey gives key a keyslot of dev's header, the lowest one not in slots, unlocked by
// previous, and returns its number. Both keys go on standard input, previous first, each
// read by its length (--keyfile-size, --new-keyfile-size). A previous key that opens no
// keyslot is ErrWrongKey: cryptsetup then writes nothing.
func (c *Cryptsetup) addKey(ctx context.Context, dev string, previous, key []byte, slots []int) (int, error) {
	free := 0
	for slices.Contains(slots, free) {
		free++
	}
	if free >= maxKeyslots {
		return -1, fmt.Errorf("crypt: %s: all %d keyslots are in use: no room for the new key", dev, maxKeyslots)
	}
	args := append([]string{"luksAddKey", "--batch-mode", "--key-slot", strconv.Itoa(free),
		"--key-file=-", "--keyfile-size", strconv.Itoa(len(previous)), "--new-keyfile-size", strconv.Itoa(len(key))},
		c.opts.kdfArgs()...)
	stdin := append(slices.Clone(previous), key...)
	out, code, err := c.run(ctx, stdin, append(args, dev, "-")...)
	clear(stdin)
	if code == exitWrongKey {
		return -1, fmt.Errorf("%s: neither the key nor the previous key opens a keyslot: %w", dev, ErrWrongKey)
	}
	if err != nil {
		return -1, cmdError(fmt.Sprintf("luksAddKey %s (keyslot %d)", dev, free), out, err)
	}
	return free, nil
}
