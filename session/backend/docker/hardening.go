package docker

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/moby/api/types/container"
)

// HardeningProblems compares a sandbox container, as the engine reports it
// (`docker inspect`), with the hardening ContainerSpec asks for, and returns
// one sentence per difference (none when the container is hardened). uid and
// gid are the sandbox user commands must run as.
func HardeningProblems(c container.InspectResponse, uid, gid int) []string {
	var out []string
	check := func(ok bool, format string, a ...any) {
		if !ok {
			out = append(out, fmt.Sprintf(format, a...))
		}
	}
	cfg, h := c.Config, c.HostConfig
	if cfg == nil || h == nil {
		return []string{"the engine reported no configuration for the container"}
	}
	check(cfg.User == ContainerUser, "user is %q, want %q (the agent starts as root with two capabilities and runs commands as %d:%d)", cfg.User, ContainerUser, uid, gid)
	check(slices.Equal(cfg.Cmd, []string{fmt.Sprintf("-user=%d:%d", uid, gid)}), "the agent's arguments are %q, want -user=%d:%d", cfg.Cmd, uid, gid)
	check(uid > 0 && gid > 0, "the sandbox user %d:%d is root", uid, gid)
	check(len(h.CapDrop) == 1 && capName(h.CapDrop[0]) == "ALL", "CapDrop is %v, want [ALL]", h.CapDrop)
	added := make([]string, 0, len(h.CapAdd))
	for _, c := range h.CapAdd {
		added = append(added, capName(c))
	}
	slices.Sort(added)
	check(slices.Equal(added, []string{"SETGID", "SETUID"}), "CapAdd is %v, want exactly SETUID and SETGID", h.CapAdd)
	check(!h.Privileged, "the container is privileged")
	// The host paths a sandbox may have, each bind-mounted read-only: the
	// agent's file where the image would hold it, and an empty file over
	// /etc/resolv.conf (lookups fail at once; the proxy resolves names).
	allowed := func(typ, source, target string, readOnly bool) bool {
		return typ == "bind" && readOnly && (target == AgentPath || source == ResolvConf && target == "/etc/resolv.conf")
	}
	targets := map[string]bool{}
	for _, m := range h.Mounts {
		check(allowed(string(m.Type), m.Source, m.Target, m.ReadOnly) && !targets[m.Target], "the container has host mounts")
		targets[m.Target] = true
	}
	check(len(h.Binds) == 0 && len(h.VolumesFrom) == 0, "the container has host mounts")
	for _, m := range c.Mounts {
		check(m.Type == "tmpfs" || allowed(string(m.Type), m.Source, m.Destination, !m.RW),
			"mount %s is %s, want tmpfs only (and, read-only, the agent's file and %s over /etc/resolv.conf)", m.Destination, m.Type, ResolvConf)
		check(!strings.Contains(m.Source, "docker.sock"), "the Docker socket is mounted")
	}
	check(!h.PidMode.IsHost() && !h.IpcMode.IsHost() && !h.UTSMode.IsHost() && !h.UsernsMode.IsHost() && !h.NetworkMode.IsHost(),
		"the container shares a host namespace")
	check(h.Memory > 0 && h.MemorySwap == h.Memory, "memory %d and memory+swap %d: want a limit and no swap", h.Memory, h.MemorySwap)
	check(h.NanoCPUs > 0, "no CPU limit")
	check(h.PidsLimit != nil && *h.PidsLimit > 0, "no PID limit")
	check(h.ReadonlyRootfs, "the root filesystem is writable")
	check(len(h.Devices) == 0 && len(h.DeviceRequests) == 0, "the container has devices")
	nnp := false
	for _, s := range h.SecurityOpt {
		check(!strings.Contains(s, "unconfined"), "security option %q", s)
		nnp = nnp || s == "no-new-privileges" || strings.HasPrefix(s, "no-new-privileges=true") || strings.HasPrefix(s, "no-new-privileges:true")
	}
	check(nnp, "no-new-privileges is not set")
	check(h.Init != nil && *h.Init, "no init reaps orphans")
	check(h.LogConfig.Type == "none", "the engine logs the container's output (%q)", h.LogConfig.Type)
	return out
}

// capName is a capability's name without CAP_, in upper case.
func capName(s string) string {
	return strings.TrimPrefix(strings.ToUpper(s), "CAP_")
}

// procStatus is /proc/<pid>/status as a map of its lines.
func procStatus(b []byte) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			m[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return m
}

// CommandStatusProblems checks the /proc/self/status of a command run in a
// sandbox: every uid and gid the sandbox user's, the groups its gid and one
// command group, no capability at all, no_new_privs set and a seccomp filter
// on. It returns one sentence per difference.
func CommandStatusProblems(status []byte, uid, gid int) []string {
	return commandStatusProblems(status, uid, gid, true)
}

// UnprivilegedCommandStatusProblems is CommandStatusProblems for commands an
// agent without privileges started (the Kubernetes backend's, where the pod
// is the boundary): they have no group of their own, only the sandbox
// user's.
func UnprivilegedCommandStatusProblems(status []byte, uid, gid int) []string {
	return commandStatusProblems(status, uid, gid, false)
}

func commandStatusProblems(status []byte, uid, gid int, ownGroup bool) []string {
	st := procStatus(status)
	var out []string
	check := func(ok bool, format string, a ...any) {
		if !ok {
			out = append(out, fmt.Sprintf(format, a...))
		}
	}
	u, g := strconv.Itoa(uid), strconv.Itoa(gid)
	check(st["Uid"] == strings.Join([]string{u, u, u, u}, " "), "command uids are %q, want %s everywhere", st["Uid"], u)
	check(st["Gid"] == strings.Join([]string{g, g, g, g}, " "), "command gids are %q, want %s everywhere", st["Gid"], g)
	groups := strings.Fields(st["Groups"])
	if ownGroup {
		check(len(groups) == 2 && slices.Contains(groups, g) && !slices.Contains(groups, "0"),
			"command groups are %q, want %s and the command's own group", st["Groups"], g)
	} else {
		check(!slices.ContainsFunc(groups, func(x string) bool { return x != g }),
			"command groups are %q, want %s at most", st["Groups"], g)
	}
	for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
		v, err := strconv.ParseUint(st[c], 16, 64)
		check(err == nil && v == 0, "command %s is %q, want no capability", c, st[c])
	}
	check(st["NoNewPrivs"] == "1", "command NoNewPrivs is %q, want 1", st["NoNewPrivs"])
	check(st["Seccomp"] == "2", "command Seccomp is %q, want 2 (a filter)", st["Seccomp"])
	return out
}

// AgentStatusProblems checks the agent's /proc/<pid>/status: real and saved
// ids 0, effective and file-system ids the sandbox user's, no supplementary
// group, CAP_SETUID and CAP_SETGID permitted and nothing effective,
// no_new_privs set and a seccomp filter on.
func AgentStatusProblems(status []byte, uid, gid int) []string {
	st := procStatus(status)
	var out []string
	check := func(ok bool, format string, a ...any) {
		if !ok {
			out = append(out, fmt.Sprintf(format, a...))
		}
	}
	u, g := strconv.Itoa(uid), strconv.Itoa(gid)
	check(st["Uid"] == "0 "+u+" 0 "+u, "agent uids are %q, want 0 %s 0 %s", st["Uid"], u, u)
	check(st["Gid"] == "0 "+g+" 0 "+g, "agent gids are %q, want 0 %s 0 %s", st["Gid"], g, g)
	check(st["Groups"] == "", "agent groups are %q, want none", st["Groups"])
	for _, c := range []struct {
		name string
		want uint64
	}{{"CapInh", 0}, {"CapPrm", 1<<6 | 1<<7}, {"CapEff", 0}, {"CapAmb", 0}} { // 6, 7: CAP_SETGID, CAP_SETUID
		v, err := strconv.ParseUint(st[c.name], 16, 64)
		check(err == nil && v == c.want, "agent %s is %q, want %016x", c.name, st[c.name], c.want)
	}
	check(st["NoNewPrivs"] == "1", "agent NoNewPrivs is %q, want 1", st["NoNewPrivs"])
	check(st["Seccomp"] == "2", "agent Seccomp is %q, want 2 (a filter)", st["Seccomp"])
	return out
}
