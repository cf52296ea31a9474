package pool

// MemberFree reports, for each Active and present disk by disk UUID, how many bytes of
// volume data one new member extent on that disk can hold now: its largest free range less
// the engine's metadata at the head of an extent, rounded down to the chunk size and to
// SizeGranularity. A new volume over n disks holds n*min(MemberFree)/2 bytes (md near-2),
// which is how the node agent lets the controller size volumes without knowing the label
// layout. Spares, failed, missing and refused disks are absent (they take no new extents).
func (p *Pool) MemberFree() map[string]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]uint64, len(p.disks))
	for _, d := range p.disks {
		if !d.usable() || d.label == nil {
			continue
		}
		// volumeFor with two members is exactly the data one member extent holds.
		out[d.uuid.String()] = p.volumeFor(largestFree(d.label), 2)
	}
	return out
}
