package ublk

import "testing"

// TestAutoBufReg: the addr of a fetch with automatic buffer registration is struct
// ublk_auto_buf_reg as the kernel decodes it: the slot in bits 0-15, no flags (no
// UBLK_AUTO_BUF_REG_FALLBACK), the reserved bits zero (the kernel refuses the command
// otherwise).
func TestAutoBufReg(t *testing.T) {
	for _, tag := range []uint16{0, 1, 63, maxQueueDepth - 1} {
		a := autoBufReg(tag)
		if idx, flags, rsv := uint16(a), uint8(a>>16), a>>24; idx != tag || flags != 0 || rsv != 0 {
			t.Errorf("tag %d: addr %#x decodes to index %d, flags %#x, reserved %#x", tag, a, idx, flags, rsv)
		}
	}
}
