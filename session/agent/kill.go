package agent

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// proc is what killTree needs to know of a process.
type proc struct {
	pid, ppid, pgid int
	zombie          bool
}

// killTree kills every process a command started and returns how many it
// signalled. A process belongs to the command when it is in the command's
// process group (pgid, which is the command's pid), carries the command's
// marker in its environment, or descends from such a process. That covers
// background jobs, nohup, setsid and double forks. Each round stops the
// processes it finds before looking again, so nothing can fork its way out
// while the agent looks; then all of them are killed.
//
// A process that both leaves the group and replaces its environment, and
// whose parent has already exited, is not found; it dies with the sandbox.
func killTree(pgid int, marker string) int {
	self := os.Getpid()
	needle := []byte(MarkerVar + "=" + marker + "\x00")
	found := map[int]bool{}
	// The group first: it holds the command itself.
	_ = syscall.Kill(-pgid, syscall.SIGSTOP)
	for round := 0; round < 16; round++ {
		procs := scanProcs()
		added := false
		// Iterate to a fixed point so descendants of descendants are found.
		for changed := true; changed; {
			changed = false
			for _, p := range procs {
				if p.pid == self || p.pid == 1 || found[p.pid] || p.zombie {
					continue
				}
				if p.pgid == pgid || found[p.ppid] || hasMarker(p.pid, needle) {
					found[p.pid] = true
					_ = syscall.Kill(p.pid, syscall.SIGSTOP)
					changed, added = true, true
				}
			}
		}
		if !added {
			break
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for pid := range found {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(found)
}

// scanProcs lists the processes visible in /proc.
func scanProcs() []proc {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]proc, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if p, ok := readStat(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// readStat parses /proc/<pid>/stat. The command name may hold spaces and
// parentheses, so fields are counted from the last ')'.
func readStat(pid int) (proc, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return proc{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return proc{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	// state ppid pgrp session ...
	if len(f) < 4 {
		return proc{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgid, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return proc{}, false
	}
	return proc{pid: pid, ppid: ppid, pgid: pgid, zombie: f[0] == "Z" || f[0] == "X"}, true
}

func hasMarker(pid int, needle []byte) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	// environ entries are NUL-terminated; match a whole entry.
	return bytes.HasPrefix(b, needle) || bytes.Contains(b, append([]byte{0}, needle...))
}
