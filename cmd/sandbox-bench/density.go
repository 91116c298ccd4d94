package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The density goal (issue 22 §6): 1,000 idle sandboxes on a 24 GiB host,
// warm exec p99 ≤ 25 ms at that count, no failed create.
const (
	densityGoalN      = 1000
	densityGoalHost   = 24 << 30 // bytes
	densityGoalP99    = 25.0     // ms
	densityMinHostMem = 2 << 30  // bytes: the run stops below this much MemAvailable
	densityMaxFails   = 10       // consecutive failed creates that stop the run
)

// densityOpts say how far the density step goes (-density, -density-budget).
type densityOpts struct {
	ns     []int         // the counts of idle sandboxes to measure at, ascending
	budget time.Duration // wall time for the creates; past it the run stops where it is
}

// parseDensity reads -density: a comma list of positive counts, returned
// ascending without repeats.
func parseDensity(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-density %q: %q is not a positive count", s, f)
		}
		ns = append(ns, n)
	}
	if len(ns) == 0 {
		return nil, fmt.Errorf("-density %q names no count", s)
	}
	slices.Sort(ns)
	return slices.Compact(ns), nil
}

// atN returns the samples that measure "creating one at n": the last
// tenth (at least 5) of the creates that brought the count to n.
func atN(samples []float64) []float64 {
	w := max(5, len(samples)/10)
	return samples[max(0, len(samples)-w):]
}

// memSample is what the host spends on the server, the engine and the
// sandbox containers at one moment, in bytes. Processes are counted by
// their proportional set size (PSS: a page shared by k processes counts
// 1/k to each, so shims sharing their binary sum to the truth), containers
// by their memory cgroup's usage less its inactive file cache (what
// `docker stats` shows).
type memSample struct {
	Server      int64 `json:"server"`       // sandbox-mcp
	Dockerd     int64 `json:"dockerd"`      // dockerd
	Containerd  int64 `json:"containerd"`   // containerd
	Shims       int64 `json:"shims"`        // the containers' containerd-shim-runc-v2
	Overlay     int64 `json:"overlay"`      // the containers' fuse-overlayfs (where that is the storage driver)
	Containers  int64 `json:"containers"`   // the containers' memory cgroups
	HostUsed    int64 `json:"host_used"`    // MemTotal - MemAvailable of the whole host, others' work included
	Tasks       int   `json:"tasks"`        // threads on the host (each takes a pid), from /proc/loadavg
	EngineThr   int   `json:"engine_thr"`   // dockerd's and containerd's threads
	ServerThr   int   `json:"server_thr"`   // sandbox-mcp's threads
	ContainersN int   `json:"containers_n"` // containers found
	ShimThr     int   `json:"shim_thr"`     // the shims' and fuse-overlayfs' threads
	ContainerT  int   `json:"container_t"`  // the containers' own tasks (their pids cgroups)
}

func (m memSample) total() int64 {
	return m.Server + m.Dockerd + m.Containerd + m.Shims + m.Overlay + m.Containers
}

// perSandbox is the growth from base to at, divided by n.
type perSandbox struct {
	Total, Server, Engine, Containers, Host float64 // MiB
	Tasks                                   float64
}

func perIdle(base, at memSample, n int) perSandbox {
	if n <= 0 {
		return perSandbox{}
	}
	mib := func(d int64) float64 { return float64(d) / float64(n) / (1 << 20) }
	return perSandbox{
		Total:      mib(at.total() - base.total()),
		Server:     mib(at.Server - base.Server),
		Engine:     mib(at.Dockerd + at.Containerd + at.Shims + at.Overlay - base.Dockerd - base.Containerd - base.Shims - base.Overlay),
		Containers: mib(at.Containers - base.Containers),
		Host:       mib(at.HostUsed - base.HostUsed),
		Tasks:      float64(at.Tasks-base.Tasks) / float64(n),
	}
}

// densityResult is one count's measures.
type densityResult struct {
	N       int // idle sandboxes held when measured
	Per     perSandbox
	At      memSample
	Create  []float64 // ms, the creates at N (see atN)
	Warm    []float64 // ms, warm execs in random sandboxes at N
	One     []float64 // ms, warm execs with one sandbox held, the same run's baseline
	Failed  int       // failed creates up to N
	Stopped string    // why the run stopped short of the count it aimed at, or ""
	Aim     int       // the count it aimed at
	// IdleCPU is the CPU spent while all N sat idle, in percent of one
	// core: the server's, the engine's (dockerd, containerd, shims) and
	// the containers' own (their agents).
	IdleCPU [3]float64
}

// densityRow renders one count's result as a table row, against the goal.
func densityRow(r densityResult) Row {
	p50, p99 := median(r.Warm), percentile(r.Warm, 99)
	value := fmt.Sprintf("%.1f MiB/sandbox (server %.2f, engine %.1f, containers %.1f), %.0f host threads/sandbox; create at N p50 %s; warm exec p50 %s, p99 %s; %d failed creates",
		r.Per.Total, r.Per.Server, r.Per.Engine, r.Per.Containers, r.Per.Tasks, fmtMs(median(r.Create)), fmtMs(p50), fmtMs(p99), r.Failed)
	projected := r.Per.Total * densityGoalN / 1024
	row := Row{
		Measure:  fmt.Sprintf("idle sandboxes: %d held (Docker)", r.N),
		Value:    value,
		Baseline: "—",
		Goal:     fmt.Sprintf("warm exec p99 ≤ %.0f ms, 0 failed, %d × memory ≤ 24 GiB", densityGoalP99, densityGoalN),
		Met:      p99 <= densityGoalP99 && r.Failed == 0 && projected <= 24 && r.Stopped == "",
	}
	if len(r.One) > 0 {
		row.Baseline = fmt.Sprintf("warm exec with 1 sandbox held (same run): p50 %s, p99 %s", fmtMs(median(r.One)), fmtMs(percentile(r.One, 99)))
		row.Ratio = p99 / percentile(r.One, 99)
	}
	row.Note = fmt.Sprintf("while all %d sat idle the server used %.1f%% of a core, the engine %.1f%%, the containers (their agents) %.1f%%; the host's used memory",
		r.N, r.IdleCPU[0], r.IdleCPU[1], r.IdleCPU[2])
	row.Note += fmt.Sprintf(" (MemTotal − MemAvailable, other work on the host included) grew %.1f MiB per sandbox", r.Per.Host)
	if r.Stopped != "" {
		row.Measure = fmt.Sprintf("idle sandboxes: %d held of %d aimed at (Docker)", r.N, r.Aim)
		row.Note = "stopped: " + r.Stopped + "; " + row.Note
	}
	return row
}

// density: idle sandboxes made by sandbox_create (each started by a first
// `true`, then left alone) held by one server, at each count of -density:
// memory per idle sandbox (server and engine), the time to create one at
// that count, warm exec p50/p99 in a random one, failed creates.
func (b *bench) density(ctx context.Context) error {
	o := b.densityOpts
	if len(o.ns) == 0 {
		return errors.New("no -density counts")
	}
	top := o.ns[len(o.ns)-1]
	srv, err := b.startServer("--max-sandboxes", strconv.Itoa(top+1), "--idle-timeout", "0", "--max-calls-per-caller", "64")
	if err != nil {
		return err
	}
	defer b.stopDensity(srv)
	cs, err := srv.connect(ctx)
	if err != nil {
		return err
	}
	defer cs.Close()
	// The baseline: the engine and a server that has served, no sandbox.
	time.Sleep(time.Second)
	base, err := b.sampleMem(srv, 0)
	if err != nil {
		return err
	}

	deadline := time.Now().Add(o.budget)
	var handles []string
	var creates, one []float64
	failed, inARow := 0, 0
	var lastErr error
	for _, n := range o.ns {
		from := len(creates)
		stopped := ""
		for len(handles) < n && stopped == "" {
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case time.Now().After(deadline):
				stopped = fmt.Sprintf("the -density-budget of %s ran out", o.budget)
			case hostAvailable() < densityMinHostMem:
				stopped = fmt.Sprintf("the host had less than %d GiB available", densityMinHostMem>>30)
			case hostTasks() > pidMax()*8/10:
				stopped = fmt.Sprintf("the host's threads reached 80%% of kernel.pid_max (%d of %d; every thread takes a pid)", hostTasks(), pidMax())
			case inARow >= densityMaxFails:
				stopped = fmt.Sprintf("%d creates in a row failed, the last: %v", inARow, lastErr)
			}
			if stopped != "" {
				break
			}
			t := time.Now()
			h, err := createIdle(ctx, cs)
			if err != nil {
				failed++
				inARow++
				lastErr = err
				b.log.Warn("density: a create failed", "held", len(handles), "err", err)
				continue
			}
			inARow = 0
			creates = append(creates, ms(time.Since(t)))
			handles = append(handles, h)
			if len(handles) == 1 {
				// The baseline: warm execs with one sandbox held, so
				// that what N adds shows apart from the host's load.
				for range b.n(200) {
					t := time.Now()
					if _, err := execIn(ctx, cs, h); err != nil {
						return fmt.Errorf("warm exec with one sandbox: %w", err)
					}
					one = append(one, ms(time.Since(t)))
				}
				b.series("density: warm exec with 1 held", one)
			}
			if len(handles)%50 == 0 {
				b.log.Info("density", "held", len(handles), "create_ms", creates[len(creates)-1])
			}
		}
		if len(handles) == 0 {
			return fmt.Errorf("no sandbox was created: %v", lastErr)
		}
		if len(handles) <= from && stopped != "" {
			// Nothing new since the last count: say why, once.
			b.add(Row{Measure: fmt.Sprintf("idle sandboxes: %d aimed at (Docker)", n), Value: fmt.Sprintf("stopped at %d", len(handles)),
				Baseline: "—", Goal: "reached", Note: "stopped: " + stopped})
			break
		}
		time.Sleep(5 * time.Second) // let the new ones go idle
		at, err := b.sampleMem(srv, len(handles))
		if err != nil {
			return err
		}
		ids := strings.Fields(cmdOutput("docker", "ps", "-q", "--no-trunc", "--filter", "label=io.sandbox-mcp.pid="+strconv.Itoa(srv.pid())))
		var cpu [3]float64
		cpu[0], cpu[1], cpu[2] = idleCPU(srv.pid(), ids, 15*time.Second)
		var warm []float64
		for range b.n(200) {
			h := handles[rand.IntN(len(handles))]
			t := time.Now()
			if _, err := execIn(ctx, cs, h); err != nil {
				return fmt.Errorf("warm exec at %d: %w", len(handles), err)
			}
			warm = append(warm, ms(time.Since(t)))
		}
		r := densityResult{N: len(handles), Per: perIdle(base, at, len(handles)), At: at, Create: atN(creates),
			Warm: warm, Failed: failed, Stopped: stopped, Aim: n, IdleCPU: cpu, One: one}
		b.series(fmt.Sprintf("density: warm exec at %d idle", r.N), warm)
		b.series(fmt.Sprintf("density: create (until its first exec) up to %d", r.N), creates[from:])
		b.log.Info("density sample", "n", r.N, "base", base, "at", at)
		b.add(densityRow(r))
		if stopped != "" {
			break
		}
	}
	return nil
}

// createIdle makes a sandbox the way a caller does (sandbox_create) and
// runs `true` in it, which starts its container; it returns the handle.
func createIdle(ctx context.Context, cs *mcp.ClientSession) (string, error) {
	out, err := call(ctx, cs, "sandbox_create", map[string]any{})
	if err != nil {
		return "", err
	}
	h, _ := out["sandbox"].(string)
	if h == "" {
		return "", fmt.Errorf("sandbox_create returned no handle: %v", out)
	}
	if _, err := execIn(ctx, cs, h); err != nil {
		return "", err
	}
	return h, nil
}

// execIn runs `true` in the sandbox h.
func execIn(ctx context.Context, cs *mcp.ClientSession, h string) (map[string]any, error) {
	out, err := call(ctx, cs, "sandbox_exec", map[string]any{"argv": []string{"true"}, "sandbox": h})
	if err != nil {
		return nil, err
	}
	if out["exit_code"] != float64(0) {
		return nil, fmt.Errorf("true exited %v", out["exit_code"])
	}
	return out, nil
}

// stopDensity stops the server, which removes its sandboxes, giving it
// time for a thousand, then removes whatever still carries its label (a
// server killed at the deadline, a create the engine finished late).
func (b *bench) stopDensity(srv *server) {
	pid := srv.pid()
	_ = srv.cmd.Process.Signal(os.Interrupt)
	select {
	case <-srv.exit:
	case <-time.After(10 * time.Minute):
		_ = srv.cmd.Process.Kill()
		<-srv.exit
	}
	os.RemoveAll(srv.state)
	if n := removeLabeled("io.sandbox-mcp.pid=" + strconv.Itoa(pid)); n > 0 {
		b.log.Warn("density: removed containers the server left", "n", n)
	}
}

// removeLabeled removes every container carrying label, in batches, and
// returns how many there were.
func removeLabeled(label string) int {
	ids := strings.Fields(cmdOutput("docker", "ps", "-aq", "--filter", "label="+label))
	for i := 0; i < len(ids); i += 50 {
		exec.Command("docker", append([]string{"rm", "-f"}, ids[i:min(i+50, len(ids))]...)...).Run()
	}
	return len(ids)
}

// sampleMem measures the host's memory (see memSample); srv nil measures
// the engine alone.
func (b *bench) sampleMem(srv *server, want int) (memSample, error) {
	var m memSample
	procs := scanProcs()
	for _, p := range procs {
		switch {
		case srv != nil && p.pid == srv.pid():
			m.Server, m.ServerThr = p.pss, p.threads
		case p.comm == "dockerd":
			m.Dockerd += p.pss
			m.EngineThr += p.threads
		case p.comm == "containerd" && dockersContainerd(procs, p):
			m.Containerd += p.pss
			m.EngineThr += p.threads
		}
	}
	m.HostUsed = hostUsed()
	m.Tasks = hostTasks()
	if srv == nil {
		return m, nil
	}
	ids := strings.Fields(cmdOutput("docker", "ps", "-q", "--no-trunc", "--filter", "label=io.sandbox-mcp.pid="+strconv.Itoa(srv.pid())))
	m.ContainersN = len(ids)
	if want > 0 && len(ids) < want {
		b.log.Warn("density: fewer containers than sandboxes", "containers", len(ids), "sandboxes", want)
	}
	if len(ids) == 0 {
		return m, nil
	}
	var dirs []string
	for i := 0; i < len(ids); i += 100 {
		out := cmdOutput("docker", append([]string{"inspect", "-f", "{{.GraphDriver.Data.UpperDir}}"}, ids[i:min(i+100, len(ids))]...)...)
		dirs = append(dirs, strings.Fields(out)...)
	}
	m.Shims, m.Overlay, m.ShimThr = ours(procs, ids, dirs)
	for _, id := range ids {
		m.Containers += cgroupMem(id)
		if b, err := os.ReadFile("/sys/fs/cgroup/pids/docker/" + id + "/pids.current"); err == nil {
			n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			m.ContainerT += n
		}
	}
	return m, nil
}

// ours sums the PSS of the shims whose command line names one of ids and
// the fuse-overlayfs mounts whose command line names one of the upper
// directories dirs, and counts their threads.
func ours(procs []proc, ids, dirs []string) (shims, overlay int64, threads int) {
	idSet := make(map[string]bool, len(ids))
	for _, id := range ids {
		idSet[id] = true
	}
	dirSet := make(map[string]bool, len(dirs))
	for _, d := range dirs {
		dirSet[d] = true
	}
	for _, p := range procs {
		switch {
		case strings.HasPrefix(p.comm, "containerd-shim"):
			if idSet[argAfter(p.args, "-id")] {
				shims += p.pss
				threads += p.threads
			}
		case p.comm == "fuse-overlayfs":
			for _, opt := range strings.Split(argAfter(p.args, "-o"), ",") {
				if d, ok := strings.CutPrefix(opt, "upperdir="); ok && dirSet[d] {
					overlay += p.pss
					threads += p.threads
					break
				}
			}
		}
	}
	return shims, overlay, threads
}

// dockersContainerd reports whether p, a containerd, is the engine's: the
// only one on the host, or the one whose command line names docker's
// state (a Kubernetes node on the same host runs another).
func dockersContainerd(procs []proc, p proc) bool {
	n := 0
	for _, q := range procs {
		if q.comm == "containerd" {
			n++
		}
	}
	return n == 1 || strings.Contains(strings.Join(p.args, " "), "/docker/")
}

// argAfter returns the argument after flag in args, or "".
func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// proc is one host process.
type proc struct {
	pid     int
	comm    string
	args    []string
	pss     int64 // bytes
	threads int
	cpu     int64 // user and system time, clock ticks
}

// scanProcs reads every process's name, arguments, PSS and thread count
// (PSS and arguments only of the processes sampleMem counts).
func scanProcs() []proc { return readProcs(true) }

// scanProcsCPU is scanProcs without the memory, which is slow to read.
func scanProcsCPU() []proc { return readProcs(false) }

func readProcs(pss bool) []proc {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []proc
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		c, err := os.ReadFile(d + "/comm")
		if err != nil {
			continue
		}
		p := proc{pid: pid, comm: strings.TrimSpace(string(c))}
		if st, err := os.ReadFile(d + "/status"); err == nil {
			p.threads = int(statusField(string(st), "Threads:"))
		}
		if a, err := os.ReadFile(d + "/cmdline"); err == nil {
			p.args = strings.Split(strings.TrimRight(string(a), "\x00"), "\x00")
		}
		if st, err := os.ReadFile(d + "/stat"); err == nil {
			p.cpu = statTicks(string(st))
		}
		if r, err := os.ReadFile(d + "/smaps_rollup"); pss && err == nil {
			p.pss = statusField(string(r), "Pss:") << 10
		}
		out = append(out, p)
	}
	return out
}

// statTicks reads utime + stime from a /proc/PID/stat line (the fields
// after the command's closing parenthesis, which may hold spaces).
func statTicks(s string) int64 {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on every
// Linux architecture Go supports).
const clockTicks = 100

// idleCPU measures the CPU the server, the engine (dockerd, containerd,
// the containers' shims) and the containers themselves spend over d while
// nothing is asked of them, in percent of one core.
func idleCPU(srvPid int, ids []string, d time.Duration) (server, engine, containers float64) {
	idSet := make(map[string]bool, len(ids))
	for _, id := range ids {
		idSet[id] = true
	}
	ticks := func() (srv, eng, ctr int64) {
		procs := scanProcsCPU()
		for _, p := range procs {
			switch {
			case p.pid == srvPid:
				srv += p.cpu
			case p.comm == "dockerd" || p.comm == "containerd" && dockersContainerd(procs, p):
				eng += p.cpu
			case strings.HasPrefix(p.comm, "containerd-shim") && idSet[argAfter(p.args, "-id")]:
				eng += p.cpu
			}
		}
		for _, id := range ids {
			if b, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage"); err == nil {
				ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				ctr += ns
			}
		}
		return
	}
	s0, e0, c0 := ticks()
	t := time.Now()
	time.Sleep(d)
	s1, e1, c1 := ticks()
	sec := time.Since(t).Seconds()
	pct := func(dt int64) float64 { return float64(dt) / clockTicks / sec * 100 }
	return pct(s1 - s0), pct(e1 - e0), float64(c1-c0) / 1e9 / sec * 100
}

// statusField reads the number after key in a /proc file of "Key: value"
// lines (kB for sizes).
func statusField(s, key string) int64 {
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

func meminfo(key string) int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	return statusField(string(b), key) << 10
}

func hostAvailable() int64 { return meminfo("MemAvailable:") }
func hostUsed() int64      { return meminfo("MemTotal:") - meminfo("MemAvailable:") }

// hostTasks counts the host's threads (each holds a pid): the total of
// /proc/loadavg's "running/total".
func hostTasks() int {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0
	}
	_, total, _ := strings.Cut(f[3], "/")
	n, _ := strconv.Atoi(total)
	return n
}

// pidMax is kernel.pid_max: the host's threads cannot outnumber it.
func pidMax() int {
	b, _ := os.ReadFile("/proc/sys/kernel/pid_max")
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 1 << 22
	}
	return n
}

// cgroupMem is a container's memory: its cgroup's usage less inactive
// file cache (cgroup v2's memory.current or v1's memory.usage_in_bytes).
func cgroupMem(id string) int64 {
	for _, dir := range []string{"/sys/fs/cgroup/memory/docker/" + id, "/sys/fs/cgroup/system.slice/docker-" + id + ".scope", "/sys/fs/cgroup/docker/" + id} {
		usage, err := os.ReadFile(dir + "/memory.usage_in_bytes")
		if err != nil {
			usage, err = os.ReadFile(dir + "/memory.current")
		}
		if err != nil {
			continue
		}
		u, _ := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64)
		st, _ := os.ReadFile(dir + "/memory.stat")
		inactive := statusField(string(st), "total_inactive_file ")
		if inactive == 0 {
			inactive = statusField(string(st), "inactive_file ")
		}
		return u - inactive
	}
	return 0
}
