package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// lingerGrace is how long the agent keeps reading a command's output after
// the command exited, while background processes it started still hold the
// pipes open. After that the call ends; such processes keep running.
const lingerGrace = 100 * time.Millisecond

// cleanSearchPath keeps the absolute PATH entries outside the workspace, so
// a program planted in the workspace is never found by name.
func cleanSearchPath(dirs []string, workspace string) []string {
	var out []string
	ws := filepath.Clean(workspace)
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			continue
		}
		d = filepath.Clean(d)
		if d == ws || strings.HasPrefix(d, ws+"/") {
			continue
		}
		out = append(out, d)
	}
	return out
}

// resolve turns a program name into the path exec runs, the way
// agentproto.ResolveRequest describes: a bare name is searched on the fixed
// PATH, a name with a slash is taken relative to the workspace directory cwd.
// Symlinks in the directory part are resolved; the last element is kept.
func (s *server) resolve(name, cwd string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", errcode.Errorf(errcode.InvalidArgument, "argv[0] is empty or contains NUL")
	}
	var candidates []string
	if strings.Contains(name, "/") {
		p := name
		if !path.IsAbs(p) {
			if path.IsAbs(cwd) || strings.HasPrefix(path.Clean(cwd), "..") {
				return "", errcode.Errorf(errcode.OutsideWorkspace, "cwd %q is outside the workspace", cwd)
			}
			p = path.Join(s.opts.Workspace, cwd, name)
		}
		candidates = []string{path.Clean(p)}
	} else {
		for _, d := range s.path {
			candidates = append(candidates, path.Join(d, name))
		}
	}
	for _, c := range candidates {
		st, err := os.Stat(c)
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			continue
		}
		dir, err := filepath.EvalSymlinks(path.Dir(c))
		if err != nil {
			continue
		}
		return path.Join(dir, path.Base(c)), nil
	}
	return "", errcode.Errorf(errcode.NotFound,
		"program %q was not found on the sandbox's PATH (%s); check the name, or give a path", name, strings.Join(s.path, ":"))
}

// exec runs one command and sends its output and exit frame.
func (s *server) exec(ctx context.Context, c *call, req agentproto.ExecRequest) {
	res, err := s.run(ctx, c, req)
	if err != nil {
		s.sendError(c.id, err)
		return
	}
	if err := s.send(c.id, agentproto.KindExit, res, nil); err != nil {
		s.log.Warn("agent: send exit", "id", c.id, "err", err)
	}
}

func (s *server) run(ctx context.Context, c *call, req agentproto.ExecRequest) (agentproto.ExecResult, error) {
	var res agentproto.ExecResult
	if len(req.Argv) == 0 {
		return res, errcode.Errorf(errcode.InvalidArgument, "argv is empty")
	}
	prog := req.Path
	if prog == "" {
		p, err := s.resolve(req.Argv[0], req.Cwd)
		if err != nil {
			return res, err
		}
		prog = p
	}
	dir, err := s.ws.OpenDir(req.Cwd)
	if err != nil {
		return res, err
	}
	defer dir.Close()

	// Collect stdin before starting: the server sends it right behind the
	// request, and the inbox never blocks the frame reader.
	var stdin io.Reader
	if c.in != nil {
		stdin = c.in
	}

	var group uint32
	if !s.opts.Unprivileged {
		g, err := s.groups.take()
		if err != nil {
			return res, errcode.Errorf(errcode.Busy, "%v", err)
		}
		group = g
	}
	// members tells a command's processes from the others: by its group,
	// or, unprivileged, by the process tree from its process group.
	members := func(pgid int) func(procInfo, map[int]*member) bool {
		if s.opts.Unprivileged {
			return treeMembers(pgid, true)
		}
		return groupMembers(group)
	}
	env := make([]string, 0, len(s.opts.Env)+len(req.Env)+1)
	env = append(env, s.opts.Env...)
	env = append(env, req.Env...)
	env = append(env, "PWD="+path.Join(s.opts.Workspace, req.Cwd))

	outR, outW, err := os.Pipe()
	if err != nil {
		return res, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return res, fmt.Errorf("stderr pipe: %w", err)
	}
	cmd := &exec.Cmd{
		Path:   prog,
		Args:   req.Argv,
		Env:    env,
		Stdin:  stdin,
		Stdout: outW,
		Stderr: errW,
		// The directory fd is inherited across fork and closed at execve
		// (O_CLOEXEC); the child's chdir goes through it, so the directory
		// checked is the directory entered, whatever happens to its path.
		Dir:         fmt.Sprintf("/proc/self/fd/%d", dir.Fd()),
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
		// With stdin from a Reader, Wait waits for the copy to end; a
		// command that never reads its stdin must not hold the call.
		WaitDelay: lingerGrace,
	}
	// The timeout runs from here: a command can be stopped (by the sandbox
	// user, whose process it is as soon as it changed its ids) before it
	// executes its program, and then its start does not return. Its
	// timeout or cancel kills it there too.
	runCtx, cancelRun := ctx, context.CancelFunc(func() {})
	if req.TimeoutMillis > 0 {
		runCtx, cancelRun = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond)
	}
	defer cancelRun()
	// Unprivileged, a command stopped before it executes its program is not
	// found here (its pid is not known yet); the stopped start then holds
	// the call until the sandbox ends.
	unwatch := context.AfterFunc(runCtx, func() { killTree(0, members(0)) })
	start := time.Now()
	if s.opts.Unprivileged {
		err = cmd.Start()
	} else {
		err = startAs(cmd, s.opts.User, group)
	}
	killedAtStart := !unwatch()
	if err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return res, startError(req.Argv[0], prog, err)
	}
	outW.Close()
	errW.Close()

	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		res.StdoutBytes = s.pump(c.id, agentproto.KindStdout, outR, req.MaxOutput)
	}()
	go func() {
		defer readers.Done()
		res.StderrBytes = s.pump(c.id, agentproto.KindStderr, errR, req.MaxOutput)
	}()

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	pgid := cmd.Process.Pid
	var waitErr error
	stopped := func() {
		if ctx.Err() != nil {
			res.Cancelled = true
		} else {
			res.TimedOut = true
		}
	}
	select {
	case waitErr = <-waited:
		if killedAtStart {
			stopped()
		}
	case <-runCtx.Done():
		stopped()
		res.Killed = killTree(pgid, members(pgid))
		waitErr = <-waited
	}
	res.DurationNano = int64(time.Since(start))

	// Output the command wrote before it exited is in the pipes; read it
	// all. Background processes may hold the pipes open: stop waiting for
	// them after a short grace.
	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(lingerGrace):
		outR.Close()
		errR.Close()
		<-done
	}
	outR.Close()
	errR.Close()

	st := cmd.ProcessState
	if st == nil {
		return res, fmt.Errorf("wait: %w", waitErr)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.ExitCode = 128 + int(ws.Signal())
		res.Signal = unix.SignalName(ws.Signal())
	} else {
		res.ExitCode = st.ExitCode()
	}
	return res, nil
}

// pump reads one output stream to EOF, sends up to max bytes as frames and
// drops the rest, so the command never blocks on a full pipe. It returns
// the number of bytes the command wrote.
func (s *server) pump(id uint64, kind agentproto.Kind, r *os.File, max int64) int64 {
	buf := make([]byte, 32<<10)
	var total, sent int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			total += int64(n)
			if room := max - sent; room > 0 {
				chunk := buf[:min(int64(n), room)]
				if s.send(id, kind, nil, chunk) == nil {
					sent += int64(len(chunk))
				}
			}
		}
		if err != nil {
			return total
		}
	}
}

func startError(name, prog string, err error) error {
	var coded *errcode.Error
	switch {
	case errors.As(err, &coded):
		return coded
	case errors.Is(err, os.ErrNotExist):
		return errcode.Errorf(errcode.NotFound, "program %q (%s) does not exist", name, prog)
	case errors.Is(err, os.ErrPermission):
		return errcode.Errorf(errcode.InvalidArgument, "program %q (%s) is not executable: %v", name, prog, err)
	case errors.Is(err, syscall.ENOEXEC):
		return errcode.Errorf(errcode.InvalidArgument, "program %q (%s) is not a valid executable (a script needs a #! line)", name, prog)
	case errors.Is(err, syscall.EAGAIN):
		return errcode.Errorf(errcode.Busy, "the sandbox is at its process limit; wait for running commands to end, or end background processes")
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENOENT):
		return errcode.Errorf(errcode.NotFound, "cannot start %q: %v", name, err)
	}
	return fmt.Errorf("cannot start %q: %v", name, err)
}
