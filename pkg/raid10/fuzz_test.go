package raid10

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"reflect"
	"testing"
)

func validSuperblockBytes() []byte {
	sb := superblock{
		arrayUUID: [16]byte{1}, memberUUID: [16]byte{2}, role: 1, raidDisks: 3, layout: nearCopies,
		chunkSize: 65536, dataOffset: 1 << 20, dataSize: 64 << 20, arraySize: 96 << 20, events: 7, seq: 3,
		bitmapOffset: bitmapOffset, bitmapBytes: sbSize, regionSize: 1 << 20, recoveryOff: recoveryDone,
	}
	b := make([]byte, sbSize)
	sb.marshal(b)
	return b
}

// FuzzSuperblock: the decoder never panics, and whatever it accepts
// re-encodes to a superblock that decodes to the same value.
func FuzzSuperblock(f *testing.F) {
	f.Add(validSuperblockBytes())
	f.Add(make([]byte, sbSize))
	f.Add([]byte(sbMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkSuperblockRoundTrip(t, b)
		// The checksum stops almost every mutation; also fuzz the field
		// checks behind it by fixing up magic and checksum.
		c := make([]byte, sbSize)
		copy(c, b)
		copy(c, sbMagic)
		binary.LittleEndian.PutUint32(c[sbCRCOffset:], crc32.Checksum(c[:sbCRCOffset], castagnoli))
		checkSuperblockRoundTrip(t, c)
	})
}

func checkSuperblockRoundTrip(t *testing.T, b []byte) {
	{
		sb, err := unmarshalSuperblock(b)
		if err != nil {
			return
		}
		out := make([]byte, sbSize)
		sb.marshal(out)
		sb2, err := unmarshalSuperblock(out)
		if err != nil {
			t.Fatalf("re-encoded superblock rejected: %v", err)
		}
		if !reflect.DeepEqual(sb, sb2) {
			t.Fatalf("round trip changed the superblock")
		}
	}
}

// FuzzBitmapBlock: the decoder never panics and accepts only blocks whose
// bits re-encode to the same bytes.
func FuzzBitmapBlock(f *testing.F) {
	good := make([]byte, sbSize)
	bits := make([]byte, bmBitsPerBlock/8)
	bits[0], bits[100] = 0x81, 0xff
	marshalBitmapBlock(good, 2, bits)
	f.Add(good, uint32(2))
	f.Add(good, uint32(3))
	f.Add(make([]byte, sbSize), uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, idx uint32) {
		got, err := unmarshalBitmapBlock(b, idx)
		if err != nil {
			return
		}
		out := make([]byte, sbSize)
		marshalBitmapBlock(out, idx, got)
		if !bytes.Equal(out, b[:sbSize]) {
			t.Fatalf("accepted block does not re-encode to itself")
		}
	})
}
