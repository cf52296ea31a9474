package raid10

// geometry is the near-2 layout of md raid10 (mdadm --layout=n2), odd
// member counts included.
//
// md numbers the chunk slots of all members row by row: slot v lives on
// device v mod N at device chunk v div N. Array chunk c takes the two
// consecutive slots 2c and 2c+1, so its copies sit on neighbouring devices,
// wrapping to the next row after the last device. For N=3:
//
//	        dev0  dev1  dev2
//	row 0    c0    c0    c1
//	row 1    c1    c2    c2
//	row 2    c3    c3    c4
//
// This is __raid10_find_phys in drivers/md/raid10.c with near_copies=2,
// far_copies=1: dev = (2c) mod N, and the second copy is on dev+1, or on
// device 0 one row further when dev+1 == N.
type geometry struct {
	n          int   // members (raid disks)
	chunk      int64 // chunk size in bytes, a power of two
	chunkShift uint
	dataOffset int64 // member byte offset of device chunk 0
	dataSize   int64 // bytes per member used for data, a multiple of chunk
	size       int64 // array bytes
	chunks     int64 // array chunks (the last may be partial)
	region     int64 // bitmap region bytes, a multiple of chunk
	regions    int64
	bmBytes    int64 // bytes reserved for the bitmap
}

func newGeometry(n int, chunk, dataOffset, dataSize, size, region, bmBytes int64) geometry {
	g := geometry{n: n, chunk: chunk, dataOffset: dataOffset, dataSize: dataSize, size: size, region: region, bmBytes: bmBytes}
	for int64(1)<<g.chunkShift < chunk {
		g.chunkShift++
	}
	g.chunks = (size + chunk - 1) / chunk
	g.regions = (size + region - 1) / region
	return g
}

// mapChunk returns the devices holding array chunk c and the member byte
// offset of the chunk on each.
func (g *geometry) mapChunk(c int64) (d0, d1 int, o0, o1 int64) {
	v := c * nearCopies
	n := int64(g.n)
	row := v / n
	d0 = int(v % n)
	o0 = g.dataOffset + row<<g.chunkShift
	d1 = d0 + 1
	if d1 == g.n {
		d1 = 0
		row++
	}
	o1 = g.dataOffset + row<<g.chunkShift
	return d0, d1, o0, o1
}

// capacity is the number of array chunks devChunks chunks per member hold.
func capacityChunks(n int, devChunks int64) int64 { return devChunks * int64(n) / nearCopies }

// pairs reports, for state checks, the device pairs that share chunks:
// (2k, 2k+1) for even N, every neighbour (i, i+1 mod N) for odd N.
// partners returns the slots that hold the other copy of some chunk of
// slot idx: one with an even member count, two with an odd one.
func (g *geometry) partners(idx int) []int {
	var ps []int
	for _, p := range g.pairs() {
		switch idx {
		case p[0]:
			ps = append(ps, p[1])
		case p[1]:
			ps = append(ps, p[0])
		}
	}
	return ps
}

func (g *geometry) pairs() [][2]int {
	var ps [][2]int
	if g.n%2 == 0 {
		for i := 0; i < g.n; i += 2 {
			ps = append(ps, [2]int{i, i + 1})
		}
		return ps
	}
	for i := 0; i < g.n; i++ {
		ps = append(ps, [2]int{i, (i + 1) % g.n})
	}
	return ps
}
