package crypt

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	utilexec "k8s.io/utils/exec"
)

// Errors of the package. Wrapped with the device or mapping they are about.
var (
	// ErrWrongKey: the key opens no keyslot of the device's LUKS header (cryptsetup's exit
	// status 2). Nothing was written.
	ErrWrongKey = errors.New("crypt: wrong key: it opens no keyslot of the LUKS header")
	// ErrNotBlank: Format was asked to format a device that holds data (a filesystem, a
	// partition table, any signature the probe knows). Nothing was written.
	ErrNotBlank = errors.New("crypt: device is not blank: refusing to format it")
	// ErrAlreadyLUKS: Format was asked to format a device that already has a LUKS header.
	// Nothing was written.
	ErrAlreadyLUKS = errors.New("crypt: device already has a LUKS header: refusing to format it")
	// ErrNotLUKS: Open was asked to open a device without a LUKS header.
	ErrNotLUKS = errors.New("crypt: device has no LUKS header")
	// ErrMappedElsewhere: the mapping name is active over another device than the one asked.
	ErrMappedElsewhere = errors.New("crypt: mapping is active over another device")
	// ErrEmptyKey: a key of zero bytes.
	ErrEmptyKey = errors.New("crypt: empty key")
	// ErrSameKey: Rotate was given one key as both the key and the previous key; wiping the
	// previous key's keyslot would wipe the key's.
	ErrSameKey = errors.New("crypt: the key and the previous key are the same: nothing to rotate")
)

// Exit statuses of cryptsetup (cryptsetup(8), RETURN CODES).
const (
	exitWrongKey  = 2 // no permission (bad passphrase)
	exitNoDevice  = 4 // wrong device specified (also: a mapping that is not active)
	exitNotLUKS   = 1 // isLuks: the device has no LUKS header
	defaultBinary = "cryptsetup"
	defaultMapper = "/dev/mapper"
)

// ProbeFunc names the signature found on a block device ("ext4", "xfs", "crypto_LUKS", a
// partition table type...), or returns "" when the device is blank. The node plugin passes
// mount-utils' SafeFormatAndMount.GetDiskFormat (blkid -p), the check that guards mkfs.
type ProbeFunc func(dev string) (string, error)

// Key derivation functions Options.PBKDF names (cryptsetup's --pbkdf).
const (
	PBKDFArgon2id = "argon2id" // LUKS2's default: memory-hard
	PBKDFArgon2i  = "argon2i"
	PBKDFPBKDF2   = "pbkdf2" // not memory-hard; for tests, or hosts short of memory
)

// Lowest iteration counts cryptsetup accepts for --pbkdf-force-iterations, and the most
// memory it lets argon2 use (--pbkdf-memory, 4 GiB).
const (
	minIterationsPBKDF2 = 1000
	minIterationsArgon2 = 4
	maxPBKDFMemoryKiB   = 4 << 20
)

// Options tune the key derivation of new headers (the function that turns a passphrase
// into the key of keyslot 0). The zero value takes cryptsetup's defaults: argon2id, tuned
// by a benchmark to about 2 s of CPU and up to 1 GiB of memory, which is what production
// should use; the other settings exist so that tests and emulated CPUs can make it cheap.
// Opening a header costs what its derivation was set to cost when it was written.
type Options struct {
	// PBKDF is the key derivation function (--pbkdf): argon2id, argon2i or pbkdf2; "":
	// cryptsetup's default (argon2id for LUKS2).
	PBKDF string
	// PBKDFMemoryKiB caps the memory argon2 uses to derive a keyslot's key
	// (--pbkdf-memory); 0: cryptsetup's default. Not with pbkdf2.
	PBKDFMemoryKiB int
	// IterTimeMs is the time the key derivation is tuned to take (--iter-time); 0:
	// cryptsetup's default (2000 ms for LUKS2).
	IterTimeMs int
	// ForceIterations sets the iteration count and skips cryptsetup's benchmark
	// (--pbkdf-force-iterations: at least 1000 for pbkdf2, 4 for argon2); 0: benchmarked.
	// Not with IterTimeMs.
	ForceIterations int
	// Binary is the cryptsetup executable; "": cryptsetup in $PATH.
	Binary string
	// MapperDir is where device-mapper's nodes appear; "": /dev/mapper.
	MapperDir string
}

// Validate reports the first setting cryptsetup would refuse, naming it as the node
// plugin's flag (--crypt-...) does.
func (o Options) Validate() error {
	switch o.PBKDF {
	case "", PBKDFArgon2id, PBKDFArgon2i, PBKDFPBKDF2:
	default:
		return fmt.Errorf("crypt: pbkdf %q: must be argon2id, argon2i or pbkdf2 (empty: cryptsetup's default)", o.PBKDF)
	}
	minIter := minIterationsArgon2
	if o.PBKDF == PBKDFPBKDF2 {
		minIter = minIterationsPBKDF2
	}
	switch {
	case o.PBKDFMemoryKiB < 0 || o.IterTimeMs < 0 || o.ForceIterations < 0:
		return fmt.Errorf("crypt: pbkdf memory %d KiB, iter time %d ms, iterations %d: must not be negative",
			o.PBKDFMemoryKiB, o.IterTimeMs, o.ForceIterations)
	case o.PBKDFMemoryKiB > maxPBKDFMemoryKiB:
		return fmt.Errorf("crypt: pbkdf memory %d KiB: cryptsetup takes at most %d (4 GiB)", o.PBKDFMemoryKiB, maxPBKDFMemoryKiB)
	case o.PBKDF == PBKDFPBKDF2 && o.PBKDFMemoryKiB > 0:
		return fmt.Errorf("crypt: pbkdf memory %d KiB: only argon2 has a memory cost, not pbkdf2", o.PBKDFMemoryKiB)
	case o.ForceIterations > 0 && o.IterTimeMs > 0:
		return errors.New("crypt: forced iterations and an iter time: set one, not both")
	case o.ForceIterations > 0 && o.ForceIterations < minIter:
		return fmt.Errorf("crypt: forced iterations %d: cryptsetup takes at least %d for %s",
			o.ForceIterations, minIter, cmp.Or(o.PBKDF, PBKDFArgon2id))
	}
	return nil
}

// kdfArgs are luksFormat's arguments for the key derivation: none for the zero Options,
// so that cryptsetup's defaults apply.
func (o Options) kdfArgs() []string {
	var args []string
	if o.PBKDF != "" {
		args = append(args, "--pbkdf", o.PBKDF)
	}
	if o.PBKDFMemoryKiB > 0 {
		args = append(args, "--pbkdf-memory", strconv.Itoa(o.PBKDFMemoryKiB))
	}
	if o.IterTimeMs > 0 {
		args = append(args, "--iter-time", strconv.Itoa(o.IterTimeMs))
	}
	if o.ForceIterations > 0 {
		args = append(args, "--pbkdf-force-iterations", strconv.Itoa(o.ForceIterations))
	}
	return args
}

// Cryptsetup formats, opens, closes and resizes LUKS2 devices with the cryptsetup binary.
type Cryptsetup struct {
	exec  utilexec.Interface
	probe ProbeFunc
	opts  Options
}

// New returns a Cryptsetup that runs commands through exec and refuses to format a device
// on which probe finds a signature. A nil probe refuses every Format.
func New(exec utilexec.Interface, probe ProbeFunc, opts Options) *Cryptsetup {
	if opts.Binary == "" {
		opts.Binary = defaultBinary
	}
	if opts.MapperDir == "" {
		opts.MapperDir = defaultMapper
	}
	return &Cryptsetup{exec: exec, probe: probe, opts: opts}
}

// mapperNameRE is what MapperName passes on unchanged: the characters udev and dmsetup
// handle without escaping.
var mapperNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// MapperName is the device-mapper name of a volume's mapping: "raid10-crypt-" and the
// volume ID, or a hash of the ID when the ID is long or has other characters (dm names are
// at most 127 bytes and must not contain '/'). The same ID always gives the same name, so a
// restarted plugin finds the mappings it made.
func MapperName(volumeID string) string {
	if mapperNameRE.MatchString(volumeID) {
		return "raid10-crypt-" + volumeID
	}
	sum := sha256.Sum256([]byte(volumeID))
	return "raid10-crypt-" + hex.EncodeToString(sum[:16])
}

// Path is the device node of the mapping name.
func (c *Cryptsetup) Path(name string) string { return filepath.Join(c.opts.MapperDir, name) }

// IsOpen reports whether the mapping name is active (its device node exists).
func (c *Cryptsetup) IsOpen(name string) bool { return isDevice(c.Path(name)) }

// run runs cryptsetup with args, the key (if any) on its standard input, and returns its
// combined output and exit status (-1 when it did not run or was killed).
func (c *Cryptsetup) run(ctx context.Context, key []byte, args ...string) ([]byte, int, error) {
	cmd := c.exec.CommandContext(ctx, c.opts.Binary, args...)
	if key != nil {
		cmd.SetStdin(bytes.NewReader(key))
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		return out, 0, nil
	}
	var ee utilexec.ExitError
	if errors.As(err, &ee) {
		return out, ee.ExitStatus(), err
	}
	return out, -1, err
}

// cmdError describes a failed cryptsetup call with its output.
func cmdError(what string, out []byte, err error) error {
	return fmt.Errorf("crypt: cryptsetup %s: %w: %s", what, err, strings.TrimSpace(string(out)))
}

// IsLUKS reports whether dev carries a LUKS header (cryptsetup isLuks).
func (c *Cryptsetup) IsLUKS(ctx context.Context, dev string) (bool, error) {
	out, code, err := c.run(ctx, nil, "isLuks", dev)
	switch {
	case err == nil:
		return true, nil
	case code == exitNotLUKS:
		return false, nil
	default:
		return false, cmdError("isLuks "+dev, out, err)
	}
}

// Format writes a new LUKS2 header on dev with key as the passphrase of keyslot 0; the
// volume key is cryptsetup's random one. It refuses, writing nothing, a device that already
// has a LUKS header (ErrAlreadyLUKS) and one on which the probe finds any other signature
// (ErrNotBlank).
func (c *Cryptsetup) Format(ctx context.Context, dev string, key []byte) error {
	if len(key) == 0 {
		return ErrEmptyKey
	}
	luks, err := c.IsLUKS(ctx, dev)
	if err != nil {
		return err
	}
	if luks {
		return fmt.Errorf("%s: %w", dev, ErrAlreadyLUKS)
	}
	if c.probe == nil {
		return fmt.Errorf("%s: no probe to tell whether it is blank: %w", dev, ErrNotBlank)
	}
	sig, err := c.probe(dev)
	if err != nil {
		return fmt.Errorf("crypt: probe %s for signatures: %w", dev, err)
	}
	if sig != "" {
		return fmt.Errorf("%s holds %s: %w", dev, sig, ErrNotBlank)
	}
	args := append([]string{"luksFormat", "--type", "luks2", "--batch-mode", "--key-file=-"}, c.opts.kdfArgs()...)
	if out, _, err := c.run(ctx, key, append(args, dev)...); err != nil {
		return cmdError("luksFormat "+dev, out, err)
	}
	return nil
}

// Open maps dev's plaintext at Path(name) with key and returns that path. A mapping of the
// same name already active over dev is returned as it is (a repeated stage, a restarted
// plugin); one over another device is ErrMappedElsewhere. A key that opens no keyslot is
// ErrWrongKey; a device without a LUKS header ErrNotLUKS.
func (c *Cryptsetup) Open(ctx context.Context, dev, name string, key []byte) (string, error) {
	if len(key) == 0 {
		return "", ErrEmptyKey
	}
	if c.IsOpen(name) {
		backing, err := c.Backing(ctx, name)
		if err != nil {
			return "", err
		}
		if !sameDevice(backing, dev) {
			return "", fmt.Errorf("%s is active over %s, not %s: %w", name, backing, dev, ErrMappedElsewhere)
		}
		return c.Path(name), nil
	}
	luks, err := c.IsLUKS(ctx, dev)
	if err != nil {
		return "", err
	}
	if !luks {
		return "", fmt.Errorf("%s: %w", dev, ErrNotLUKS)
	}
	out, code, err := c.run(ctx, key, "open", "--type", "luks2", "--key-file=-", "--disable-keyring", dev, name)
	if code == exitWrongKey {
		return "", fmt.Errorf("open %s: %w", dev, ErrWrongKey)
	}
	if err != nil {
		return "", cmdError("open "+dev, out, err)
	}
	return c.Path(name), nil
}

// Backing returns the device under the active mapping name, as `cryptsetup status` names it.
func (c *Cryptsetup) Backing(ctx context.Context, name string) (string, error) {
	out, _, err := c.run(ctx, nil, "status", name)
	if err != nil {
		return "", cmdError("status "+name, out, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "device:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("crypt: cryptsetup status %s names no device: %s", name, strings.TrimSpace(string(out)))
}

// sameDevice reports whether two paths name the same device node (after symlinks).
func sameDevice(a, b string) bool {
	if a == b {
		return true
	}
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}

// Close removes the mapping name. A mapping that is not active is no error.
func (c *Cryptsetup) Close(ctx context.Context, name string) error {
	if !c.IsOpen(name) {
		return nil
	}
	out, code, err := c.run(ctx, nil, "close", name)
	goneMeanwhile := code == exitNoDevice && !c.IsOpen(name) // closed by someone else
	if err != nil && !goneMeanwhile {
		return cmdError("close "+name, out, err)
	}
	return nil
}

// Resize makes the active mapping name as large as its device now is (after the device
// grew online). It needs no key: Open keeps the volume key out of the kernel keyring.
func (c *Cryptsetup) Resize(ctx context.Context, name string) error {
	if out, _, err := c.run(ctx, nil, "resize", name); err != nil {
		return cmdError("resize "+name, out, err)
	}
	return nil
}
