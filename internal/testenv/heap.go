package testenv

import "runtime"

// HeapAlloc is the bytes of live heap objects after two collections (sync.Pool's victim
// cache survives one): what the memory benchmarks subtract before and after building what
// they measure.
func HeapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
