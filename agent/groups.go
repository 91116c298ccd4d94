package agent

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Every command runs with a supplementary group id of its own, and so does
// every process it starts: only a process holding CAP_SETGID can leave a
// group or join one, and none of the sandbox user's processes holds it. The
// kill-tree finds a command's processes by that group.
//
// The ids come from [CommandGroupBase, CommandGroupBase+CommandGroupCount).
// They name no group in any image and are not reused while the agent lives.
// Where the container's user namespace does not map that range (an engine
// with user-namespace remapping maps 65536 ids), the agent takes the top
// half of the highest mapped extent instead, below the overflow ids
// 65534/65535, and reuses an id only once no process holds it.
const (
	CommandGroupBase  = 2_000_000_000
	CommandGroupCount = 1 << 30
)

// minCommandGroups is the fewest ids the agent accepts to run on.
const minCommandGroups = 1024

// groupPool hands out command group ids.
type groupPool struct {
	first, count uint32

	mu      sync.Mutex
	next    uint32 // offset of the next id to try
	wrapped bool   // every id was handed out once: check before reuse
	// inUse reports the group ids some live process holds; it is only
	// called once the pool has wrapped.
	inUse func() map[uint32]bool
}

// newGroupPool sizes the pool from this process's gid map.
func newGroupPool(u User) (*groupPool, error) {
	f, err := os.Open("/proc/self/gid_map")
	if err != nil {
		return nil, fmt.Errorf("read the gid map: %w", err)
	}
	defer f.Close()
	first, count, err := commandGroupRange(f, u.GID)
	if err != nil {
		return nil, err
	}
	return &groupPool{first: first, count: count, inUse: groupsInUse}, nil
}

// commandGroupRange picks the range of group ids from the container's gid
// map (the text of /proc/self/gid_map): [CommandGroupBase, +count) where it
// is mapped, else the top half of the highest mapped extent.
func commandGroupRange(gidMap io.Reader, sandboxGID int) (first, count uint32, err error) {
	type extent struct{ start, n uint64 }
	var exts []extent
	sc := bufio.NewScanner(gidMap)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue
		}
		start, err1 := strconv.ParseUint(f[0], 10, 32)
		n, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		exts = append(exts, extent{start, n})
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("read the gid map: %w", err)
	}
	var best extent
	for _, e := range exts {
		if e.start <= CommandGroupBase && CommandGroupBase < e.start+e.n {
			end := min(e.start+e.n, 1<<32-1) // 4294967295 is no valid id
			return CommandGroupBase, uint32(min(uint64(CommandGroupCount), end-CommandGroupBase)), nil
		}
		if e.start+e.n > best.start+best.n {
			best = e
		}
	}
	// No mapping of the usual range: the top half of the highest extent,
	// kept below the overflow ids and above the sandbox's own gid.
	end := min(best.start+best.n, 65534)
	if best.start+best.n > 65536 {
		end = best.start + best.n
	}
	lo := max(best.start+best.n/2, uint64(sandboxGID)+1)
	if end <= lo || end-lo < minCommandGroups {
		return 0, 0, fmt.Errorf("the container's user namespace maps too few group ids (gid map %v) to give every command a group of its own: it needs %d ids above the sandbox gid %d", exts, minCommandGroups, sandboxGID)
	}
	return uint32(lo), uint32(min(end-lo, CommandGroupCount)), nil
}

// take returns a group id no live process holds.
func (p *groupPool) take() (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var busy map[uint32]bool
	for range p.count {
		g := p.first + p.next
		p.next++
		if p.next == p.count {
			p.next, p.wrapped = 0, true
		}
		if !p.wrapped {
			return g, nil
		}
		if busy == nil {
			busy = p.inUse()
		}
		if !busy[g] {
			return g, nil
		}
	}
	return 0, fmt.Errorf("every one of the %d command group ids is held by a live process; end background processes", p.count)
}
