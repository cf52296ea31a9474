package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	r10 "github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// encrypted is the story's encrypted claim (issue 27), on the real kubelet: a StorageClass
// with encrypted: "true" names a Secret (a random key, base64 text) through csi.storage.k8s.io/node-stage-secret-name,
// the csi-provisioner puts it in the PV, and the kubelet reads it into NodeStageVolume, where
// the node plugin's container formats and opens a LUKS2 mapping over the volume's device.
// A pod writes ioverify blocks that start with encMarker, as io-xfs's (a plain volume) start
// with plainMarker. Then the host reads the pool's NVMe disk images, every byte: plainMarker
// is there (the scan sees what a pod writes, on both copies), encMarker nowhere. The
// Raid10Volume says status.encrypted and `kubectl raid10 volumes` shows it. The pod, the
// claim, the class and the Secret are deleted at the end, so that the steps after this one
// see the volumes they saw before (the ext4 claim grows in place next).
func (s *story) encrypted(ctx context.Context) {
	t := s.t
	// A text key, as docs/parameters.md says: CSI carries secrets as strings, and the kubelet
	// cannot send 32 raw random bytes (its first run here: MountDevice failed, "grpc: error
	// while marshaling: string field contains invalid UTF-8", the driver never called).
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "enc-key", Namespace: "default"},
		StringData: map[string]string{"key": base64.StdEncoding.EncodeToString(raw)}}
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "raid10-encrypted"},
		Provisioner: "raid10.csi.io",
		Parameters: map[string]string{
			"members":   "4",
			"encrypted": "true",
			"csi.storage.k8s.io/node-stage-secret-name":      "enc-key",
			"csi.storage.k8s.io/node-stage-secret-namespace": "default",
		},
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	pvc := claim("enc", sc.Name, 64<<20, corev1.PersistentVolumeFilesystem)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "io-enc", Namespace: "default"},
		Spec: withClaim(ioPodSpec("data", "-path=/data/verify.dat", false, "-marker="+s.encMarker), "enc")}
	for _, o := range []ctrlclient.Object{secret, sc, pvc, pod} {
		s.create(ctx, o)
	}
	s.waitPodRunning(ctx, "default", pod.Name)
	s.waitRounds(ctx, pod.Name, 2)

	var vol r10.Raid10Volume
	s.poll(ctx, "the encrypted volume's status.encrypted", func() error {
		var l r10.Raid10VolumeList
		if err := s.c.List(ctx, &l); err != nil {
			return err
		}
		var names []string
		for _, v := range l.Items {
			if v.Annotations[r10.EncryptedAnnotation] == "true" {
				names = append(names, v.Name)
				vol = v
			}
		}
		if len(names) != 1 {
			return fmt.Errorf("%d volumes annotated encrypted: %v", len(names), names)
		}
		if !vol.Status.Encrypted {
			return fmt.Errorf("volume %s: status.encrypted false", vol.Name)
		}
		return nil
	})
	out := s.run(ctx, s.plugin, "--kubeconfig", s.r.Env.Kubeconfig, "volumes")
	t.Logf("kubectl raid10 volumes:\n%s", out)
	if !encryptedRow(out, vol.Name) {
		t.Errorf("kubectl raid10 volumes: volume %s not shown ENCRYPTED yes", vol.Name)
	}
	mapped, err := s.r.Exec(ctx, "ls /dev/mapper")
	t.Logf("the node's /dev/mapper (err %v): %s", err, strings.Join(strings.Fields(mapped), " "))

	// io-xfs's file: ioBlocks blocks, each on two disks (near-2 mirrors).
	markers := [][]byte{[]byte(s.plainMarker), []byte(s.encMarker)}
	plain := 0
	for i, disk := range s.r.Disks[:4] {
		found, err := scanFile(disk, markers)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("disk %d (%s): the plain volume's marker %d times, the encrypted volume's %d times", i, filepath.Base(disk), len(found[0]), len(found[1]))
		plain += len(found[0])
		if len(found[1]) > 0 {
			t.Errorf("disk %d (%s): the encrypted volume's plaintext (marker %q) at byte offsets %v", i, disk, s.encMarker, found[1][:min(len(found[1]), 5)])
		}
	}
	if plain < 2*ioBlocks {
		t.Errorf("io-xfs's marker %q found %d times on the pool's disks, want both copies of its %d blocks (%d): the scan does not see what a pod writes, so finding nothing of the encrypted volume proves nothing", s.plainMarker, plain, ioBlocks, 2*ioBlocks)
	}

	if err := s.c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	s.poll(ctx, "pod io-enc gone", func() error {
		err := s.c.Get(ctx, ctrlclient.ObjectKeyFromObject(pod), &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.Join(err, errors.New("pod io-enc still there"))
	})
	if err := s.c.Delete(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	s.poll(ctx, "the encrypted volume gone", func() error {
		err := s.c.Get(ctx, ctrlclient.ObjectKeyFromObject(&vol), &r10.Raid10Volume{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.Join(err, fmt.Errorf("Raid10Volume %s still there", vol.Name))
	})
	for _, o := range []ctrlclient.Object{sc, secret} {
		if err := s.c.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// encryptedRow reports whether `kubectl raid10 volumes` shows volume name with ENCRYPTED
// yes: the table's columns are aligned (tabwriter, which counts runes: a rebuild's bar is
// not ASCII), so the row holds the value at the heading's rune offset.
func encryptedRow(table, name string) bool {
	lines := strings.Split(table, "\n")
	col := strings.Index(lines[0], "ENCRYPTED")
	if col < 0 {
		return false
	}
	col = utf8.RuneCountInString(lines[0][:col])
	for _, l := range lines[1:] {
		r := []rune(l)
		if f := strings.Fields(l); len(f) > 0 && f[0] == name && len(r) > col {
			return strings.HasPrefix(string(r[col:]), "yes")
		}
	}
	return false
}

// scanFile returns, for each marker, the byte offsets in the file where it starts.
func scanFile(path string, markers [][]byte) ([][]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	longest := 0
	for _, m := range markers {
		longest = max(longest, len(m))
	}
	found := make([][]int64, len(markers))
	const chunk = 8 << 20
	buf := make([]byte, chunk+longest)
	keep := 0        // bytes carried over from the previous chunk, at buf[0:keep]
	base := int64(0) // the file offset of buf[0]
	for {
		n, err := io.ReadFull(f, buf[keep:keep+chunk])
		data := buf[:keep+n]
		for i, m := range markers {
			for off := 0; ; {
				j := bytes.Index(data[off:], m)
				if j < 0 {
					break
				}
				at := base + int64(off+j)
				// A match wholly inside the carried-over bytes was counted last time.
				if off+j+len(m) > keep {
					found[i] = append(found[i], at)
				}
				off += j + 1
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return found, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		keep = min(longest-1, len(data))
		copy(buf, data[len(data)-keep:])
		base += int64(len(data) - keep)
	}
}

// randHex is 16 random hex digits.
func randHex(t testing.TB) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func TestScanFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk")
	data := make([]byte, 3*(8<<20)+100)
	long, short := []byte("r10-secret-0123456789abcdef"), []byte("r10-p")
	// One across the first chunk boundary, one at the start, one at the very end, and a
	// short marker inside the bytes carried over the second boundary.
	at := map[int]int64{0: 8<<20 - 5, 1: 0, 2: int64(len(data) - len(long))}
	for _, o := range at {
		copy(data[o:], long)
	}
	copy(data[2*(8<<20)-10:], short)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	found, err := scanFile(path, [][]byte{long, short})
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{0, 8<<20 - 5, int64(len(data) - len(long))}
	if fmt.Sprint(found[0]) != fmt.Sprint(want) {
		t.Errorf("long marker at %v, want %v", found[0], want)
	}
	if fmt.Sprint(found[1]) != fmt.Sprint([]int64{2*(8<<20) - 10}) {
		t.Errorf("short marker at %v, want [%d]", found[1], 2*(8<<20)-10)
	}
}

func TestEncryptedRow(t *testing.T) {
	table := "NAME     NODE  REBUILD     ENCRYPTED  AGE\n" +
		"pvc-a    n1    ▓▓▓░ 75%    yes        1m\n" +
		"pvc-b    n1    -           no         1m\n"
	for name, want := range map[string]bool{"pvc-a": true, "pvc-b": false, "pvc-c": false} {
		if got := encryptedRow(table, name); got != want {
			t.Errorf("encryptedRow(%s) = %v, want %v", name, got, want)
		}
	}
}
