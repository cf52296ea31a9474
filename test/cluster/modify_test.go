package cluster

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	r10 "github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// The limit a VolumeAttributesClass puts on a running claim, as its pod sees it (issue 26,
// section 2's Done-when: "a claim's class changed, the limit seen by fio"). The pod image has
// no fio (Debian's links the Ceph and Gluster libraries, 100 MB more); ioverify is the tool
// in it: each round writes 2 MiB with O_DIRECT in 64 KiB blocks and logs how long the writes
// (and their fsync) took, which is the write rate the pod gets.
const (
	slowClass = "raid10-slow-writes"
	fastClass = "raid10-no-limits"
	// modifyLimit is the slow class's maxWriteBytesPerSecond: a round's 2 MiB take 8 s.
	modifyLimit = 256 << 10
	// modifyBurst is its maxWriteBytesBurst, one of ioverify's blocks, so that a round's
	// writes go at the rate from the second block on (the default burst, a tenth of a second
	// at the rate, would be 25 KiB: every block would wait anyway).
	modifyBurst = 64 << 10
	// roundBytes is what an ioverify round of the story writes (ioPodSpec: -size).
	roundBytes = 2 << 20
)

// modify moves the Block claim of pod io-block to a class with a low write bandwidth limit:
// the external-resizer's modify controller calls ControllerModifyVolume, the node agent puts
// the limit on the array, the claim's status.currentVolumeAttributesClassName follows, and
// the pod's next rounds write at the limit (achieved / limit between 0.5 and 1.1; the 64 KiB
// burst alone would allow 1.03). Then to a class whose "0" lifts the limit: the writes go
// faster than the limit again, so the rest of the story runs unthrottled.
func (s *story) modify(ctx context.Context) {
	t := s.t
	for name, bw := range map[string]string{slowClass: strconv.Itoa(modifyLimit), fastClass: "0"} {
		burst := "0"
		if bw != "0" {
			burst = strconv.Itoa(modifyBurst)
		}
		s.create(ctx, &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name},
			DriverName: r10.DriverName,
			Parameters: map[string]string{"maxWriteBytesPerSecond": bw, "maxWriteBytesBurst": burst}})
	}
	before := s.writeRate(ctx, "io-block", 1)
	t.Logf("io-block writes at %.0f KiB/s without a limit", before/1024)

	start := time.Now()
	s.setClaimClass(ctx, "block", slowClass, func(l *r10.VolumeLimits) error {
		if l == nil || l.WriteBytesPerSecond != modifyLimit || l.WriteBytesBurst != modifyBurst {
			return fmt.Errorf("status.limits %+v", l)
		}
		return nil
	})
	t.Logf("claim block in class %s, limit applied by the node %v after the change", slowClass, time.Since(start).Round(100*time.Millisecond))
	t.Logf("kubectl raid10 volumes:\n%s", s.run(ctx, s.plugin, "--kubeconfig", s.r.Env.Kubeconfig, "volumes"))
	// The round under way when the limit came may have written part of its 2 MiB before it;
	// the round after it is wholly under the limit.
	got := s.writeRate(ctx, "io-block", 2)
	ratio := got / modifyLimit
	t.Logf("io-block writes at %.0f KiB/s under maxWriteBytesPerSecond %d KiB/s: ratio %.2f (before: %.0f KiB/s)",
		got/1024, modifyLimit>>10, ratio, before/1024)
	if ratio < 0.5 || ratio > 1.1 {
		t.Errorf("achieved / limit = %.2f, want 0.5 to 1.1", ratio)
	}

	s.setClaimClass(ctx, "block", fastClass, func(l *r10.VolumeLimits) error {
		if l != nil {
			return fmt.Errorf("status.limits %+v, want none", l)
		}
		return nil
	})
	// The proof that the limit, not the node, held the writes down: without it they go
	// faster. Checked after the lift, not before the limit: the first rounds, beside the
	// other pods' start, can run under 1.5 times the limit on a loaded host (365 KiB/s once,
	// then 965 KiB/s after the lift in the same run). Up to 4 rounds after the lift, the
	// fastest counted: one round of a loaded host can run slow (341 KiB/s once, in a CI run
	// beside other test builds), while under the limit no round passes 1.1 times it.
	after := s.writeRate(ctx, "io-block", 2)
	for i := 0; i < 3 && after < 1.5*modifyLimit; i++ {
		next := s.writeRate(ctx, "io-block", 1)
		t.Logf("claim block in class %s: a round at %.0f KiB/s after one at %.0f KiB/s", fastClass, next/1024, after/1024)
		after = max(after, next)
	}
	t.Logf("claim block in class %s: io-block writes at %.0f KiB/s", fastClass, after/1024)
	if after < 1.5*modifyLimit {
		t.Errorf("after the limit was lifted: %.0f KiB/s at best in 4 rounds, want over 1.5 times the old limit", after/1024)
	}
}

// writeRE finds the write time in a round's line (roundRE).
var writeRE = regexp.MustCompile(`ok: write (\d+)ms`)

// setClaimClass sets claim's volumeAttributesClassName to class and waits until the claim's
// status.currentVolumeAttributesClassName is class and its Raid10Volume's status.limits
// (what the node agent applied) satisfy applied.
func (s *story) setClaimClass(ctx context.Context, claim, class string, applied func(*r10.VolumeLimits) error) {
	var pvc corev1.PersistentVolumeClaim
	key := ctrlclient.ObjectKey{Namespace: "default", Name: claim}
	if err := s.c.Get(ctx, key, &pvc); err != nil {
		s.t.Fatal(err)
	}
	patch := ctrlclient.MergeFrom(pvc.DeepCopy())
	pvc.Spec.VolumeAttributesClassName = ptr.To(class)
	if err := s.c.Patch(ctx, &pvc, patch); err != nil {
		s.t.Fatalf("claim %s to class %s: %v", claim, class, err)
	}
	s.poll(ctx, "claim "+claim+" in class "+class, func() error {
		if err := s.c.Get(ctx, key, &pvc); err != nil {
			return err
		}
		if cur := ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, ""); cur != class {
			return fmt.Errorf("status.currentVolumeAttributesClassName %q, modifyVolumeStatus %+v", cur, pvc.Status.ModifyVolumeStatus)
		}
		var pv corev1.PersistentVolume
		if err := s.c.Get(ctx, ctrlclient.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			return err
		}
		var v r10.Raid10Volume // named by the volume's ID, the PV's volumeHandle
		if err := s.c.Get(ctx, ctrlclient.ObjectKey{Name: pv.Spec.CSI.VolumeHandle}, &v); err != nil {
			return err
		}
		return applied(v.Status.Limits)
	})
}

// writeRate waits until pod p logged n more rounds than it has now and returns the write
// rate of the last one, in bytes per second.
func (s *story) writeRate(ctx context.Context, p string, n int) float64 {
	have, _ := s.rounds(ctx, p)
	var ms int
	s.poll(ctx, fmt.Sprintf("pod %s: %d more rounds", p, n), func() error {
		all := roundRE.FindAllStringSubmatch(s.ioLog(ctx, p), -1)
		if len(all) < have+n {
			return fmt.Errorf("%d rounds, want %d", len(all), have+n)
		}
		m := writeRE.FindStringSubmatch(all[len(all)-1][0])
		if m == nil {
			return fmt.Errorf("no write time in %q", all[len(all)-1][0])
		}
		ms, _ = strconv.Atoi(m[1])
		return nil
	})
	s.rounds(ctx, p) // fails the test on an ERROR line
	return float64(roundBytes) / (float64(max(ms, 1)) / 1000)
}
