package main

// Rendering of local mode: pool.Status and its parts (disks, volumes, members, snapshots).

import (
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// status prints the pool: its capacity, then its disks, its volumes and each volume's members.
func (r renderer) status(s pool.Status) error {
	if ok, err := r.structured(s); ok {
		return err
	}
	c := s.Capacity
	ew := &errWriter{w: r.w}
	ew.printf("Pool %s (%s)\n", s.Name, s.UUID)
	ew.printf("Capacity: raw %s, usable %s (mirrored), free %s, largest new volume %s, spares %s\n\n",
		human(c.Raw), human(c.Usable), human(c.FreeUsable), human(c.LargestVolume), human(c.Spare))
	if ew.err != nil {
		return ew.err
	}
	if err := r.disks(s.Disks); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(r.w); err != nil {
		return err
	}
	if err := r.volumes(s.Volumes); err != nil {
		return err
	}
	for _, v := range s.Volumes {
		if _, err := fmt.Fprintln(r.w); err != nil {
			return err
		}
		if err := r.members(v); err != nil {
			return err
		}
	}
	return nil
}

// disks prints the pool's disks, then why each one that is not active is so.
func (r renderer) disks(ds []pool.DiskInfo) error {
	if ok, err := r.structured(ds); ok {
		return err
	}
	tw, ew := r.table()
	ew.printf("DISK\tPATH\tSTATUS\tSIZE\tUSED\tFREE\tEXTENTS\tIDENTITY\n")
	var reasons []string
	for _, d := range ds {
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", short(d.UUID), dash(d.Path), d.Status,
			human(d.Size), human(d.Used), human(d.Free), d.Extents, dash(d.Identity))
		if d.Reason != "" {
			reasons = append(reasons, fmt.Sprintf("  %s: %s", dash(d.Path), d.Reason))
		}
	}
	if err := flush(tw, ew); err != nil {
		return err
	}
	ew = &errWriter{w: r.w}
	for _, s := range reasons {
		ew.printf("%s\n", s)
	}
	return ew.err
}

// volumes prints the pool's volumes with their resync, their QoS limits in force, whether
// each is open through dm-crypt here and the NBD socket that serves each (the standalone agent's, when it exists), then why each one that
// is not healthy is so and what the limits of each delayed.
func (r renderer) volumes(vs []pool.VolumeInfo) error {
	if ok, err := r.structured(vs); ok {
		return err
	}
	tw, ew := r.table()
	ew.printf("NAME\tSIZE\tHEALTH\tMEMBERS\tBAD BLOCKS\tREBUILD\tLIMITS\tENCRYPTED\tNBD\n")
	for _, v := range vs {
		sock := nbdSocket(r.o.RunDir, v.Name)
		if _, err := os.Stat(sock); err != nil {
			sock = "-"
		}
		ew.printf("%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\n", v.Name, human(v.Size), v.Health, v.InSync, len(v.Members),
			blocks(v.BadBlocks, v.LostBlocks), syncColumn(v.Sync), localLimitsColumn(v.Limits), localEncryptedColumn(r.o, v.Name), sock)
	}
	if err := flush(tw, ew); err != nil {
		return err
	}
	ew = &errWriter{w: r.w}
	for _, v := range vs {
		if v.Reason != "" {
			ew.printf("  %s: %s\n", v.Name, v.Reason)
		}
		if s := throttleLine(v); s != "" {
			ew.printf("  %s: %s\n", v.Name, s)
		}
	}
	return ew.err
}

// members prints a volume's members: role, disk, state, bad blocks and deadline timeouts.
func (r renderer) members(v pool.VolumeInfo) error {
	tw, ew := r.table()
	ew.printf("  %s\tROLE\tDISK\tPATH\tSTATE\tBAD BLOCKS\tTIMEOUTS\n", v.Name)
	for _, m := range v.Members {
		ew.printf("  \t%d\t%s\t%s\t%s\t%d\t%d\n", m.Role, short(m.DiskUUID), dash(m.DiskPath), m.State, m.BadBlocks, m.TimedOut)
	}
	return flush(tw, ew)
}

// localSnapshots prints the pool's snapshots with their copy progress, of volume source when
// not empty.
func (r renderer) localSnapshots(all []pool.SnapshotInfo, source string) error {
	var snaps []pool.SnapshotInfo
	for _, s := range all {
		if source == "" || s.Source == source {
			snaps = append(snaps, s)
		}
	}
	if snaps == nil {
		snaps = []pool.SnapshotInfo{}
	}
	if ok, err := r.structured(snaps); ok {
		return err
	}
	tw, ew := r.table()
	ew.printf("NAME\tSOURCE\tSIZE\tCOPY\tCOPIED\tHEALTH\tMEMBERS\tCUT\n")
	now := time.Now()
	for _, s := range snaps {
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s ago\n", s.Name, s.Source, human(s.Size), snapshotCopyBar(s), human(s.Copied),
			s.Health, s.Members, age(metav1.NewTime(s.CutAt), now))
	}
	if len(snaps) == 0 {
		ew.printf("(no snapshot)\n")
	}
	return flush(tw, ew)
}
