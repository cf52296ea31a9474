package raid10

// recordedLost reports whether the array block at byte aoff is known lost: some copy of
// its chunk is in sync and every in-sync copy has the block recorded bad (media that did
// not deliver it, see recordBad). A block that merely could not be read now, because the
// members holding it are gone or hung (their failure as a whole is never recorded as bad
// blocks, see mediaError), is not: it may read fine when they are back.
func (a *Array) recordedLost(aoff int64) bool {
	c := aoff / a.geo.chunk
	within := aoff & (a.geo.chunk - 1)
	d0, d1, o0, o1 := a.geo.mapChunk(c)
	inSync := 0
	for _, x := range [2]struct {
		d int
		o int64
	}{{d0, o0 + within}, {d1, o1 + within}} {
		r := a.slots[x.d].inSync()
		if r == nil {
			continue
		}
		inSync++
		if !r.bad.Load().has(x.o / BlockSize) {
			return false
		}
	}
	return inSync > 0
}
