package agent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of one killTree.
const (
	// killRounds bounds the stop-and-rescan rounds; each round stops every
	// member it finds, so only processes forked while a round ran are left
	// for the next.
	killRounds = 32
	// killSettle bounds the wait for the killed members to be gone (a
	// SIGKILLed process is gone as soon as the kernel has torn it down).
	killSettle = 2 * time.Second
)

// procInfo is what killTree needs to know of a process.
type procInfo struct {
	pid    int
	live   bool
	groups []uint32
	ppid   int // parent pid in the agent's pid namespace (0: outside it)
	pgid   int // process group in the agent's pid namespace
}

func (p procInfo) in(group uint32) bool {
	for _, g := range p.groups {
		if g == group {
			return true
		}
	}
	return false
}

// killTree kills every process of a command and returns how many it
// signalled. A process belongs to the command when it holds the command's
// supplementary group: the command was started in it, every process inherits
// it, and none can leave it (that needs CAP_SETGID). Leaving the process
// group, double forks, a new session, a cleared environment and a cleared
// dumpable flag change nothing: /proc/<pid>/status shows the groups of every
// process.
//
// The process group (pgid > 0; the command's pid while the command has not
// been waited for) is stopped first. Then each round stops every member it
// finds, so nothing can fork its way out while the agent looks, until a
// round finds no new member. Then all are killed, and the group is swept
// until no live process holds it.
func killTree(pgid int, isMember func(procInfo, map[int]*member) bool) int {
	if pgid > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGSTOP)
	}
	found := map[int]*member{}
	defer func() {
		for _, m := range found {
			m.close()
		}
	}()
	for range killRounds {
		added := false
		for _, p := range scanProcs() {
			if !p.live || found[p.pid] != nil || !isMember(p, found) {
				continue
			}
			if m := openMember(p.pid, found, isMember); m != nil {
				found[p.pid] = m
				m.signal(unix.SIGSTOP)
				added = true
			}
		}
		if !added {
			break
		}
	}
	if pgid > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	for _, m := range found {
		m.signal(unix.SIGKILL)
	}
	// A fork in flight when its parent was stopped may have left a member
	// no round saw: kill whatever still holds the group.
	deadline := time.Now().Add(killSettle)
	for time.Now().Before(deadline) {
		left := false
		for _, p := range scanProcs() {
			if !p.live || !isMember(p, found) {
				continue
			}
			left = true
			if found[p.pid] == nil {
				if m := openMember(p.pid, found, isMember); m != nil {
					found[p.pid] = m
				}
			}
			if m := found[p.pid]; m != nil {
				m.signal(unix.SIGKILL)
			}
		}
		if !left {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return len(found)
}

// member is a process found in a command's group, held by a pidfd so that a
// signal never reaches another process that took its pid.
type member struct {
	pid, fd int // fd -1: no pidfd (kernel before 5.3), signal by pid
}

// groupMembers finds a command's processes by the supplementary group it
// was started in.
func groupMembers(group uint32) func(procInfo, map[int]*member) bool {
	return func(p procInfo, _ map[int]*member) bool { return p.in(group) }
}

// treeMembers finds a command's processes without a group of their own
// (an unprivileged agent cannot give one): its process group pgid, every
// child of a member found, and, with orphans, every orphan the namespace's
// init adopted (parent pid 1), which is where a double fork ends up.
// Orphans of other commands running at the same time are taken too: an
// unprivileged agent cannot tell them apart.
func treeMembers(pgid int, orphans bool) func(procInfo, map[int]*member) bool {
	return func(p procInfo, found map[int]*member) bool {
		if pgid <= 0 {
			return false
		}
		return p.pgid == pgid || (orphans && p.ppid == 1) || (p.ppid > 0 && found[p.ppid] != nil)
	}
}

// openMember opens pid and checks, after opening it, that it is still a
// member: the pidfd then names that very process.
func openMember(pid int, found map[int]*member, isMember func(procInfo, map[int]*member) bool) *member {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if !errors.Is(err, unix.ENOSYS) {
			return nil // gone already
		}
		fd = -1
	}
	m := &member{pid: pid, fd: fd}
	if p, ok := readStatus(pid); !ok || !isMember(p, found) {
		m.close()
		return nil
	}
	return m
}

func (m *member) signal(sig unix.Signal) {
	if m.fd < 0 {
		_ = unix.Kill(m.pid, sig)
		return
	}
	_ = unix.PidfdSendSignal(m.fd, sig, nil, 0)
}

func (m *member) close() {
	if m.fd >= 0 {
		unix.Close(m.fd)
		m.fd = -1
	}
}

// scanProcs lists the processes visible in /proc, the agent and PID 1 left
// out.
func scanProcs() []procInfo {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	self := os.Getpid()
	out := make([]procInfo, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self || pid == 1 {
			continue
		}
		if p, ok := readStatus(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// readStatus parses the State and Groups lines of /proc/<pid>/status,
// which every process may read, whatever the target's dumpable flag.
//
// The status is the process's main thread's. A process whose main thread
// ended (a raw exit, not exit_group) while other threads run on shows
// State Z there and lives: it is live when any of its tasks
// (/proc/<pid>/task/*) is. A signal to the process reaches those threads.
func readStatus(pid int) (procInfo, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return procInfo{}, false
	}
	p, ok := parseStatus(pid, b)
	if ok && !p.live {
		p.live = liveTask(dir)
	}
	return p, ok
}

// liveTask reports whether a task of the process at dir (/proc/<pid>) is
// neither a zombie nor dead.
func liveTask(dir string) bool {
	d, err := os.Open(dir + "/task")
	if err != nil {
		return false
	}
	defer d.Close()
	for {
		names, err := d.Readdirnames(64)
		for _, n := range names {
			b, err := os.ReadFile(dir + "/task/" + n + "/stat")
			if err == nil && taskLive(b) {
				return true
			}
		}
		if err != nil {
			return false
		}
	}
}

// taskLive reads the state in a task's stat line, "tid (comm) S ...": the
// comm may hold spaces and parentheses, the state follows the last ')'.
func taskLive(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	f := bytes.Fields(stat[i+1:])
	return len(f) > 0 && f[0][0] != 'Z' && f[0][0] != 'X'
}

func parseStatus(pid int, b []byte) (procInfo, bool) {
	p := procInfo{pid: pid}
	seen := 0
	for line := range bytes.Lines(b) {
		key, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(val)
		switch string(key) {
		case "State":
			if len(f) == 0 {
				return p, false
			}
			// Z (zombie) and X (dead) hold no resources worth a signal,
			// unless other threads of the process run on (readStatus).
			p.live = f[0][0] != 'Z' && f[0][0] != 'X'
			seen++
		case "PPid":
			if len(f) == 1 {
				p.ppid, _ = strconv.Atoi(string(f[0]))
			}
		case "NSpgid":
			// One value per nested pid namespace, the innermost last.
			if len(f) > 0 {
				p.pgid, _ = strconv.Atoi(string(f[len(f)-1]))
			}
		case "Groups":
			for _, g := range f {
				v, err := strconv.ParseUint(string(g), 10, 32)
				if err != nil {
					return p, false
				}
				p.groups = append(p.groups, uint32(v))
			}
			seen++
		}
	}
	return p, seen == 2
}

// groupHasMembers reports whether a live process still holds group.
func groupHasMembers(group uint32) bool {
	for _, p := range scanProcs() {
		if p.live && p.in(group) {
			return true
		}
	}
	return false
}

// groupsInUse returns the supplementary groups of every live process.
func groupsInUse() map[uint32]bool {
	out := map[uint32]bool{}
	for _, p := range scanProcs() {
		if p.live {
			for _, g := range p.groups {
				out[g] = true
			}
		}
	}
	return out
}
