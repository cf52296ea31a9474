package pool

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// The pool fault matrix's model (see TestPoolMatrix): what every volume, snapshot, clone
// and restore must read, block by block, and the disks' volatile write cache that its
// crashes drop.

const mBlock = raid10.BlockSize

// fillTag writes block content tag into b (one block): zeroes for tag 0, else the tag
// and a pattern derived from it, so that a read names the write it returns.
func fillTag(b []byte, tag uint64) {
	if tag == 0 {
		clear(b)
		return
	}
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], tag*0x9e3779b97f4a7c15+uint64(i))
	}
	binary.LittleEndian.PutUint64(b, tag)
}

// tagOf names the write block b holds: its tag, or ok false for content no write made.
func tagOf(b []byte) (tag uint64, ok bool) {
	tag = binary.LittleEndian.Uint64(b)
	want := make([]byte, len(b))
	fillTag(want, tag)
	return tag, string(want) == string(b)
}

// blockState is what one block of an object must read.
type blockState struct {
	cur   uint64   // the last acknowledged write (0: zeroes)
	known bool     // a read must return cur; false: any of may (after a crash)
	undef bool     // a failed write left it undefined: any content, or EIO
	may   []uint64 // what a crash may leave: the last flushed content and every write acknowledged since
	own   bool     // written through this object (not only filled by its copy)
}

// objModel is one volume or snapshot of the walk.
type objModel struct {
	name   string
	snap   bool
	source string // a copy target's source ("" for an empty volume)
	blocks []blockState
	disks  []string // its disks' paths when the pool last stopped
	hidden bool     // every one of its disks is left out: the pool cannot know it
}

func newObj(name string, snap bool, size int64) *objModel {
	o := &objModel{name: name, snap: snap, blocks: make([]blockState, size/mBlock)}
	for i := range o.blocks {
		o.blocks[i] = blockState{known: true, may: []uint64{0}}
	}
	return o
}

// copyOf is a new copy target of src as of now; its blocks past src's read zeroes.
func copyOf(name string, snap bool, src *objModel, size int64) *objModel {
	o := newObj(name, snap, size)
	o.source = src.name
	for i, b := range src.blocks {
		if i < len(o.blocks) {
			o.blocks[i] = blockState{cur: b.cur, known: b.known, undef: b.undef, may: slices.Clone(b.may)}
		}
	}
	return o
}

// wrote records the outcome of a write of tags at block first.
func (o *objModel) wrote(first int64, tags []uint64, err error) {
	for i, tag := range tags {
		b := &o.blocks[first+int64(i)]
		if err != nil {
			b.undef, b.known = true, false
			b.may = append(b.may, tag)
			continue
		}
		b.cur, b.known, b.undef, b.own = tag, true, false, true
		b.may = append(b.may, tag)
	}
}

// flushed records a flush of the object that succeeded; hydrated says its copy (if any) is
// done, so every block it holds was its own to flush.
func (o *objModel) flushed(hydrated bool) {
	for i := range o.blocks {
		b := &o.blocks[i]
		if b.known && !b.undef && (b.own || hydrated || o.source == "") {
			b.may = []uint64{b.cur}
		}
	}
}

// closedClean records a clean Close: every array flushed, so what each block holds now is
// what it keeps.
func (o *objModel) closedClean() {
	for i := range o.blocks {
		if b := &o.blocks[i]; b.known && !b.undef {
			b.may = []uint64{b.cur}
		}
	}
}

// crashed records a crash: every block may now hold any content its history allows.
func (o *objModel) crashed() {
	for i := range o.blocks {
		b := &o.blocks[i]
		if len(b.may) == 1 && !b.undef {
			b.cur, b.known = b.may[0], true
			continue
		}
		b.known = false
	}
}

// grown records an expansion to size bytes: the new blocks read zeroes.
func (o *objModel) grown(size int64) {
	for int64(len(o.blocks)) < size/mBlock {
		o.blocks = append(o.blocks, blockState{known: true, may: []uint64{0}})
	}
}

// check compares block i's content with the model: "" when allowed, else why not.
func (o *objModel) check(i int64, got []byte) string {
	b := &o.blocks[i]
	if b.undef {
		return ""
	}
	tag, ok := tagOf(got)
	switch {
	case !ok:
		return fmt.Sprintf("%s block %d: content no write made (first word %#x); want %s", o.name, i, tag, b.describe())
	case b.known && tag != b.cur:
		return fmt.Sprintf("%s block %d: holds write %d; want %s", o.name, i, tag, b.describe())
	case !b.known && !slices.Contains(b.may, tag):
		return fmt.Sprintf("%s block %d: holds write %d; want %s", o.name, i, tag, b.describe())
	}
	return ""
}

func (b *blockState) describe() string {
	if b.known {
		return fmt.Sprintf("write %d (a crash may leave %v)", b.cur, b.may)
	}
	return fmt.Sprintf("one of %v (after a crash)", b.may)
}

// matrixDisk is a disk's data path in the matrix: a volatile write cache over the file
// (raid10.FaultyMember), which a crash drops (in part) and a pull makes fail. Close writes
// the cache back (a clean exit leaves the page cache to the kernel) unless it is gone.
type matrixDisk struct {
	*raid10.FaultyMember
	file raid10.Member
}

func (m *matrixDisk) Close() error {
	_ = m.Flush()
	return m.file.Close()
}

// matrixTally counts what the walks did, for the log line.
type matrixTally struct {
	mu          sync.Mutex
	seeds       int
	steps       int
	ops         map[string]int            // transition kind -> count (refused ones too)
	refused     map[string]int            // transition kind -> refusals
	faults      map[string]map[string]int // fault kind -> phase -> count
	blocksRead  int64
	eio         int64 // blocks that read EIO where allowed
	failedCopy  int   // copy targets that ended Failed
	notServed   int   // Array refusals of a copy target or unassembled volume
	wrong       int   // must stay 0
	freedChecks int
}

func newTally() *matrixTally {
	return &matrixTally{ops: map[string]int{}, refused: map[string]int{}, faults: map[string]map[string]int{}}
}

func (m *matrixTally) op(kind string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops[kind]++
	if err != nil {
		m.refused[kind]++
	}
}

func (m *matrixTally) fault(kind, phase string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.faults[kind] == nil {
		m.faults[kind] = map[string]int{}
	}
	m.faults[kind][phase]++
}

func (m *matrixTally) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "pool matrix: %d seeds, %d steps; blocks read %d, EIO where allowed %d; copy targets Failed %d; not served %d; empty-pool capacity checks %d; wrong data: %d",
		m.seeds, m.steps, m.blocksRead, m.eio, m.failedCopy, m.notServed, m.freedChecks, m.wrong)
	b.WriteString("\n  transitions (refused):")
	for _, k := range sortedKeys(m.ops) {
		fmt.Fprintf(&b, " %s=%d(%d)", k, m.ops[k], m.refused[k])
	}
	b.WriteString("\n  faults by phase:")
	for _, k := range sortedKeys(m.faults) {
		fmt.Fprintf(&b, "\n    %-14s", k)
		for _, ph := range sortedKeys(m.faults[k]) {
			fmt.Fprintf(&b, " %s=%d", ph, m.faults[k][ph])
		}
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
