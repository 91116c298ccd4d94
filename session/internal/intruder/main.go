// Command intruder plays the sandboxed code in the session package's
// security tests: it runs inside a sandbox as an ordinary command and tries
// what hostile code would try against the processes that hold the protocol
// stream (PID 1, the container's init, and the agent), and hides from the
// kill-tree. It is built statically by the tests and copied into the
// workspace; it is no part of the product.
//
//	intruder probe             try every attack once on PID 1 and the agent; one line each
//	intruder impersonate SECS LOG
//	                           for SECS seconds, keep trying to stop the agent, open
//	                           the stream and answer the server with forged frames;
//	                           counts go to LOG
//	intruder hide [-clearenv]  start a child in a new session that clears its dumpable
//	                           flag (and, with -clearenv, has an empty environment) and
//	                           sleeps; return at once
//	intruder leaderless        start a child in a new session that ends its main thread
//	                           (a raw exit, not exit_group) while another thread runs on
//	                           holding stdout and stderr; print its pid once its main
//	                           thread shows State Z, and return
//	intruder procs UID         list the live processes whose real uid is UID (a process
//	                           with a zombie main thread and a live thread included),
//	                           this one left out
//	intruder stop-starts SECS  for SECS seconds, stop every command the agent is starting
//	                           (before it executes its program); print how many
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// The leaderless child's main goroutine must run on the main thread, the
// thread it ends.
func init() {
	if len(os.Args) > 1 && os.Args[1] == "leaderless-child" {
		runtime.LockOSThread()
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: intruder probe|impersonate|hide|procs ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "probe":
		probe()
	case "impersonate":
		secs, _ := strconv.Atoi(os.Args[2])
		impersonate(time.Duration(secs)*time.Second, os.Args[3])
	case "hide":
		hide(len(os.Args) > 2 && os.Args[2] == "-clearenv")
	case "hidden":
		hidden()
	case "leaderless":
		leaderless()
	case "leaderless-child":
		leaderlessChild()
	case "stop-starts":
		secs, _ := strconv.Atoi(os.Args[2])
		stopStarts(time.Duration(secs) * time.Second)
	case "procs":
		uid, _ := strconv.Atoi(os.Args[2])
		procs(uid)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

// agentPID finds the agent: the child of PID 1 whose command name is
// "agent" (a command the agent is starting has that name too, until it
// executes its program).
func agentPID() int {
	for _, p := range listProcs() {
		if p.name == "agent" && p.ppid == 1 {
			return p.pid
		}
	}
	return 0
}

type procEntry struct {
	pid, ppid int
	name      string
	fields    map[string]string // the lines of /proc/<pid>/status
}

// listProcs reads /proc/<pid>/status of every process.
func listProcs() []procEntry {
	names, _ := os.ReadDir("/proc")
	var out []procEntry
	for _, n := range names {
		pid, err := strconv.Atoi(n.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + n.Name() + "/status")
		if err != nil {
			continue
		}
		fields := map[string]string{}
		for _, line := range strings.Split(string(st), "\n") {
			k, v, _ := strings.Cut(line, ":")
			fields[k] = strings.TrimSpace(v)
		}
		ppid, _ := strconv.Atoi(fields["PPid"])
		out = append(out, procEntry{pid: pid, ppid: ppid, name: fields["Name"], fields: fields})
	}
	return out
}

// outcome is "ok" or the errno's name.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// probe tries each attack once on PID 1 and on the agent and prints one
// line per attempt: "<attempt> <target>: <outcome>".
func probe() {
	agent := agentPID()
	fmt.Printf("agent pid %d\n", agent)
	if agent == 0 {
		os.Exit(1)
	}
	for _, t := range []struct {
		name string
		pid  int
	}{{"init", 1}, {"agent", agent}} {
		p := "/proc/" + strconv.Itoa(t.pid)
		report := func(what string, err error) { fmt.Printf("%s %s: %s\n", what, t.name, outcome(err)) }
		report("open-stdin", openClose(p+"/fd/0", os.O_RDONLY))
		report("open-stdout", openClose(p+"/fd/1", os.O_WRONLY))
		_, err := os.ReadDir(p + "/fd")
		report("list-fds", err)
		_, err = os.ReadFile(p + "/environ")
		report("read-environ", err)
		report("open-mem", openClose(p+"/mem", os.O_RDONLY))
		report("ptrace-attach", ptrace(t.pid, false))
		report("ptrace-seize", ptrace(t.pid, true))
		report("signal-stop", unix.Kill(t.pid, unix.SIGSTOP))
		report("signal-term", unix.Kill(t.pid, unix.SIGTERM))
		report("signal-kill", unix.Kill(t.pid, unix.SIGKILL))
	}
}

func openClose(path string, flag int) error {
	f, err := os.OpenFile(path, flag, 0)
	if err == nil {
		f.Close()
	}
	return err
}

// ptrace attaches to pid (PTRACE_ATTACH or PTRACE_SEIZE) and detaches again
// when that worked.
func ptrace(pid int, seize bool) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if seize {
		if err := unix.PtraceSeize(pid); err != nil {
			return err
		}
		_ = unix.PtraceInterrupt(pid)
	} else if err := unix.PtraceAttach(pid); err != nil {
		return err
	}
	var ws unix.WaitStatus
	_, _ = unix.Wait4(pid, &ws, unix.WALL, nil)
	_ = unix.PtraceDetach(pid)
	return nil
}

// impersonate keeps trying, for d, to take the agent's place: stop it, open
// the container's stdin and stdout through /proc, and answer the server's
// requests with forged frames. It writes what it tried and what worked to
// logPath.
func impersonate(d time.Duration, logPath string) {
	counts := map[string]int{}
	write := func() {
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s %d\n", k, counts[k])
		}
		_ = os.WriteFile(logPath, []byte(b.String()), 0o644)
	}
	deadline := time.Now().Add(d)
	for i := 0; time.Now().Before(deadline); i++ {
		counts["rounds"]++
		agent := agentPID()
		for _, pid := range []int{1, agent} {
			if pid == 0 {
				continue
			}
			counts["stop-"+outcome(unix.Kill(pid, unix.SIGSTOP))]++
		}
		for _, pid := range []int{1, agent} {
			if pid == 0 {
				continue
			}
			p := "/proc/" + strconv.Itoa(pid)
			in, errIn := os.Open(p + "/fd/0")
			counts["open-stdin-"+outcome(errIn)]++
			out, errOut := os.OpenFile(p+"/fd/1", os.O_WRONLY, 0)
			counts["open-stdout-"+outcome(errOut)]++
			if errIn == nil && errOut == nil {
				counts["hijacked"]++
				write()
				forge(in, out, deadline)
			}
			if in != nil {
				in.Close()
			}
			if out != nil {
				out.Close()
			}
		}
		if i%50 == 0 {
			write()
		}
		time.Sleep(2 * time.Millisecond)
	}
	write()
}

// forge answers every request read from in with a forged answer on out.
func forge(in, out *os.File, deadline time.Time) {
	_ = in.SetReadDeadline(deadline)
	r := agentproto.NewReader(in)
	w := agentproto.NewWriter(out)
	written := map[uint64]int64{}
	forged := []byte("FORGED\n")
	for time.Now().Before(deadline) {
		f, err := r.Read()
		if err != nil {
			return
		}
		switch f.Kind {
		case agentproto.KindPing:
			_ = w.Write(f.ID, agentproto.KindPong, nil, nil)
		case agentproto.KindExec:
			_ = w.Write(f.ID, agentproto.KindStdout, nil, forged)
			_ = w.Write(f.ID, agentproto.KindExit, agentproto.ExecResult{StdoutBytes: int64(len(forged))}, nil)
		case agentproto.KindRead:
			_ = w.Write(f.ID, agentproto.KindData, nil, forged)
			_ = w.Write(f.ID, agentproto.KindResult, agentproto.ReadResult{Size: int64(len(forged))}, nil)
		case agentproto.KindWrite, agentproto.KindRestore:
			written[f.ID] = 0
		case agentproto.KindData:
			written[f.ID] += int64(len(f.Payload))
		case agentproto.KindEOF:
			n := written[f.ID]
			_ = w.Write(f.ID, agentproto.KindResult, agentproto.WriteResult{Written: n, Size: n}, nil)
		case agentproto.KindList:
			_ = w.Write(f.ID, agentproto.KindData, nil, []byte(`{"path":"FORGED","type":"file","size":7,"mode":420,"mtime":"2000-01-01T00:00:00Z"}`+"\n"))
			_ = w.Write(f.ID, agentproto.KindResult, agentproto.ListResult{Count: 1}, nil)
		case agentproto.KindResolve:
			var req agentproto.ResolveRequest
			_ = f.Decode(&req)
			res := agentproto.ResolveResult{Paths: make([]string, len(req.Names))}
			for i := range res.Paths {
				res.Paths[i] = "/workspace/FORGED"
			}
			_ = w.Write(f.ID, agentproto.KindResult, res, nil)
		case agentproto.KindSnapshot:
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			_ = tw.WriteHeader(&tar.Header{Name: "FORGED", Mode: 0o4777, Size: int64(len(forged)), Typeflag: tar.TypeReg})
			_, _ = tw.Write(forged)
			_ = tw.WriteHeader(&tar.Header{Name: "host", Linkname: "/etc/shadow", Mode: 0o777, Typeflag: tar.TypeSymlink})
			_ = tw.Close()
			_ = w.Write(f.ID, agentproto.KindData, nil, b.Bytes())
			_ = w.Write(f.ID, agentproto.KindResult, agentproto.SnapshotResult{Files: 2, Bytes: int64(b.Len())}, nil)
		}
	}
}

// hide starts a child that leaves the process group and the session and
// clears its dumpable flag (its environment unreadable by others), and
// returns at once, so the child is orphaned.
func hide(clearEnv bool) {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command(self, "hidden")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if clearEnv {
		cmd.Env = []string{}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(cmd.Process.Pid)
}

func hidden() {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		os.Exit(1)
	}
	for {
		time.Sleep(time.Hour)
	}
}

// leaderless starts leaderless-child in a new session, with this
// process's stdout and stderr, and returns once the child's main thread has
// ended and another of its threads runs: its status then reads State Z.
func leaderless() {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command(self, "leaderless-child")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if strings.Contains(string(st), "State:\tZ") && liveThreads(pid) > 0 {
			fmt.Println(pid)
			return
		}
	}
	fmt.Fprintln(os.Stderr, "the child's main thread did not end")
	os.Exit(1)
}

// leaderlessChild runs a thread that sleeps on, holding the process's
// files, and ends the main thread alone.
func leaderlessChild() {
	running := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(running)
		for {
			time.Sleep(time.Hour)
		}
	}()
	<-running
	for {
		_, _, _ = syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
	}
}

// liveThreads counts the tasks of pid that are neither zombies nor dead.
func liveThreads(pid int) int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	n := 0
	for _, t := range tasks {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if i := strings.LastIndexByte(string(st), ')'); err == nil && i >= 0 {
			if f := strings.Fields(string(st[i+1:])); len(f) > 0 && f[0] != "Z" && f[0] != "X" {
				n++
			}
		}
	}
	return n
}

// procs prints "pid comm state groups" for every live process whose real
// uid is uid, this process left out. A process whose main thread is a
// zombie is live while another of its threads is.
func procs(uid int) {
	for _, p := range listProcs() {
		uids := strings.Fields(p.fields["Uid"])
		if p.pid == os.Getpid() || len(uids) == 0 || uids[0] != strconv.Itoa(uid) {
			continue
		}
		if strings.HasPrefix(p.fields["State"], "Z") && liveThreads(p.pid) == 0 {
			continue
		}
		fmt.Printf("%d %s %s groups=%s\n", p.pid, p.name, p.fields["State"], p.fields["Groups"])
	}
}

// stopStarts keeps stopping, for d, every command the agent is starting
// (a child of the agent that has not executed its program yet, so still
// named "agent"), and prints how many it stopped.
func stopStarts(d time.Duration) {
	stopped := 0
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		for _, p := range listProcs() {
			if p.name == "agent" && p.ppid != 1 && unix.Kill(p.pid, unix.SIGSTOP) == nil {
				stopped++
			}
		}
	}
	fmt.Println("stopped", stopped)
}
