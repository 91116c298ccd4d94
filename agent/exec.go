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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// lingerGrace is how long the agent keeps reading a command's output after
// the command exited, while background processes it started still hold the
// pipes open. After that the call ends; such processes keep running.
const lingerGrace = 100 * time.Millisecond

// drainCeiling bounds the wait for the readers of a command's output once
// no process of the command is left: the pipes then have no writer, and the
// readers end as soon as they have taken what the command wrote, however
// late a loaded machine schedules them or a slow server takes the frames.
const drainCeiling = 10 * time.Second

// waitForOutput waits for done (every byte of a command's output read).
// After grace it goes on waiting only while nothing holds the pipes
// (lingering() false: no process of the command left; a command without
// a group of its own counts as lingering), up to ceiling. It
// reports whether done came. Without the second wait, a command that
// exited while its output sat unread in a pipe (the readers not yet
// scheduled, or held up sending the previous chunk) ended with that output
// missing from its result.
//
// It stops as soon as stop or detach is closed (the server cancelled the
// call, or stopped waiting for it): a process that is no member of the
// command (one of another job, which reopened the command's pipe) may hold
// the pipes, and then only the server's word ends the wait before the
// server gives the agent up.
func waitForOutput(done, stop, detach <-chan struct{}, grace, ceiling time.Duration, lingering func() bool) bool {
	select {
	case <-done:
		return true
	default:
	}
	select {
	case <-done:
		return true
	case <-stop:
		return false
	case <-detach:
		return false
	case <-time.After(grace):
	}
	if lingering() {
		return false
	}
	select {
	case <-done:
		return true
	case <-stop:
		return false
	case <-detach:
		return false
	case <-time.After(ceiling):
		return false
	}
}

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

// maxExecStdin bounds the stdin an exec request carries in its data frames.
const maxExecStdin = 64 << 20

// exec runs one command as a job. A foreground exec sends its output
// frames and its exit frame; a background exec answers at once with the
// job's status.
func (s *server) exec(ctx context.Context, c *call, req agentproto.ExecRequest) {
	if err := s.run(ctx, c, req); err != nil {
		s.sendError(c.id, err)
	}
}

// run starts the command and, for a foreground exec, waits for it. It
// returns an error only before the command started; after that it sends
// the terminal frame itself.
func (s *server) run(ctx context.Context, c *call, req agentproto.ExecRequest) error {
	if len(req.Argv) == 0 {
		return errcode.Errorf(errcode.InvalidArgument, "argv is empty")
	}
	prog := req.Path
	if prog == "" {
		p, err := s.resolve(req.Argv[0], req.Cwd)
		if err != nil {
			return err
		}
		prog = p
	}
	dir, err := s.ws.OpenDir(req.Cwd)
	if err != nil {
		return err
	}
	defer dir.Close()

	// Collect stdin before starting: the server sends it right behind the
	// request, and the inbox never blocks the frame reader.
	var stdinData []byte
	if c.in != nil {
		stdinData, err = io.ReadAll(io.LimitReader(c.in, maxExecStdin+1))
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		if len(stdinData) > maxExecStdin {
			return errcode.Errorf(errcode.TooLarge, "stdin is larger than %d bytes; write it to a file and redirect it", maxExecStdin)
		}
	}

	var group uint32
	if !s.opts.Unprivileged {
		g, err := s.groups.take()
		if err != nil {
			return errcode.Errorf(errcode.Busy, "%w", err)
		}
		group = g
	}
	env := make([]string, 0, len(s.opts.Env)+len(req.Env)+1)
	env = append(env, s.opts.Env...)
	env = append(env, req.Env...)
	env = append(env, "PWD="+path.Join(s.opts.Workspace, req.Cwd))

	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll()
		return fmt.Errorf("stderr pipe: %w", err)
	}
	inR, inW, err := pipe()
	if err != nil {
		closeAll()
		return fmt.Errorf("stdin pipe: %w", err)
	}
	label := req.Label
	if len(label) > maxLabel {
		label = strings.ToValidUTF8(label[:maxLabel], "") + "..."
	}
	oomBase, ok := oomKills()
	if !ok {
		oomBase = -1
	}
	j := &job{
		id: req.Job, label: label, started: time.Now(), group: group, oomBase: oomBase, unprivileged: s.opts.Unprivileged,
		stdin: inW, stdinSem: make(chan struct{}, 1),
		out:     [2]ring{newRing(req.KeepOutput), newRing(req.KeepOutput)},
		changed: make(chan struct{}),
		readers: []*os.File{outR, errR},
	}
	// sent counts the output streamed live (under j.mu).
	var sent [2]int64
	if !req.Background {
		kinds := [2]agentproto.Kind{agentproto.KindStdout, agentproto.KindStderr}
		j.live = func(stream int, p []byte) {
			if room := req.MaxOutput - sent[stream]; room > 0 {
				chunk := p[:min(int64(len(p)), room)]
				if s.send(c.id, kinds[stream], nil, chunk) == nil {
					sent[stream] += int64(len(chunk))
				}
			}
		}
	}
	if req.Job != 0 {
		if err := s.jobs.add(j, req.MaxJobs); err != nil {
			closeAll()
			return err
		}
	}

	cmd := &exec.Cmd{
		Path:   prog,
		Args:   req.Argv,
		Env:    env,
		Stdin:  inR,
		Stdout: outW,
		Stderr: errW,
		// The directory fd is inherited across fork and closed at execve
		// (O_CLOEXEC); the child's chdir goes through it, so the directory
		// checked is the directory entered, whatever happens to its path.
		Dir:         fmt.Sprintf("/proc/self/fd/%d", dir.Fd()),
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	// A command lives as long as the connection, and a foreground one
	// until its request is cancelled too, unless the server detaches it
	// first: it then runs on as a background job.
	life, endLife := context.WithCancel(s.root)
	keepWithRequest := func() bool { return false }
	if !req.Background {
		keepWithRequest = context.AfterFunc(ctx, endLife)
	}
	var detached atomic.Bool
	// The timeout runs from here: a command can be stopped (by the sandbox
	// user, whose process it is as soon as it changed its ids) before it
	// executes its program, and then its start does not return. Its
	// timeout or cancel kills it there too.
	runCtx, cancelRun := life, endLife
	if req.TimeoutMillis > 0 {
		var cancelTimeout context.CancelFunc
		runCtx, cancelTimeout = context.WithTimeout(life, time.Duration(req.TimeoutMillis)*time.Millisecond)
		cancelRun = func() { cancelTimeout(); endLife() }
	}
	// Unprivileged, a command stopped before it executes its program is not
	// found here (its pid is not known yet); the stopped start then holds
	// the call until the sandbox ends.
	unwatch := context.AfterFunc(runCtx, func() { killTree(0, j.members(0)) })
	start := time.Now()
	if s.opts.Unprivileged {
		err = cmd.Start()
	} else {
		err = startAs(cmd, s.opts.User, group)
	}
	killedAtStart := !unwatch()
	if err != nil {
		cancelRun()
		closeAll()
		s.jobs.remove(req.Job)
		return startError(req.Argv[0], prog, err)
	}
	outW.Close()
	errW.Close()
	inR.Close()
	pgid := cmd.Process.Pid
	j.mu.Lock()
	j.pgid = pgid
	j.mu.Unlock()

	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); j.pump(0, outR) }()
	go func() { defer readers.Done(); j.pump(1, errR) }()
	// The first input goes in from its own goroutine: a command that does
	// not read it must not hold the call. A foreground command's stdin ends
	// after it; a background job's stays open for sandbox_job.
	go func() {
		j.stdinSem <- struct{}{}
		defer func() { <-j.stdinSem }()
		if len(stdinData) > 0 && j.stdin != nil {
			_, _ = j.stdin.Write(stdinData)
		}
		if !req.Background && j.stdin != nil {
			j.stdin.Close()
			j.stdin = nil
		}
	}()

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	// wait waits for the command and records how it ended.
	wait := func() (res agentproto.ExecResult, waitErr error) {
		// A foreground command is cancelled with its request, until it is
		// detached; else what stops it is its timeout (or the connection's
		// end, which is no timeout).
		background := func() bool { return req.Background || detached.Load() }
		stopped := func() {
			if ctx.Err() != nil && !background() {
				res.Cancelled = true
			} else if s.root.Err() == nil || !background() {
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
			res.Killed = killTree(pgid, j.members(pgid))
			waitErr = <-waited
		}
		res.DurationNano = int64(time.Since(start))
		cancelRun()
		j.finish(cmd.ProcessState, res.TimedOut)
		// A process the command left behind may hold stdin: writers to it
		// give up now, and it is closed.
		_ = inW.SetWriteDeadline(time.Now())
		j.closeStdin()
		return res, waitErr
	}

	if req.Background {
		go func() { _, _ = wait() }()
		j.mu.Lock()
		st := j.statusLocked()
		j.mu.Unlock()
		s.finish(c.id, st, nil)
		return nil
	}

	var res agentproto.ExecResult
	var waitErr error
	finished := make(chan struct{})
	go func() {
		res, waitErr = wait()
		close(finished)
	}()
	// A detach frame makes a command that still runs a background job: its
	// output is kept, and its next read starts after what went live. A
	// command cancelled or ended meanwhile answers as usual.
	detach := c.detach
	if req.Job == 0 {
		detach = nil
	}
	select {
	case <-finished:
	case <-detach:
		j.mu.Lock()
		if !j.ended && keepWithRequest() {
			detached.Store(true)
			j.live = nil
			j.cursor = sent
			st := j.statusLocked()
			j.mu.Unlock()
			s.finish(c.id, st, nil)
			return nil
		}
		j.mu.Unlock()
		<-finished
	}
	// Output the command wrote before it exited is in the pipes; read it
	// all. Background processes may hold the pipes open: stop waiting for
	// them after a short grace. A kept job goes on reading what they
	// write; a command run without a job drops it.
	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	if !waitForOutput(done, ctx.Done(), detach, lingerGrace, drainCeiling, func() bool { return group == 0 || groupHasMembers(group) }) {
		res.PipesHeld = true
		if req.Job == 0 {
			outR.Close()
			errR.Close()
			<-done
		}
	}
	if req.Job == 0 {
		outR.Close()
		errR.Close()
	}
	j.mu.Lock()
	j.live = nil
	res.StdoutBytes, res.StderrBytes = j.out[0].total, j.out[1].total
	j.cursor = [2]int64{res.StdoutBytes, res.StderrBytes}
	st := j.status
	j.mu.Unlock()
	if cmd.ProcessState == nil {
		return fmt.Errorf("wait: %w", waitErr)
	}
	res.ExitCode, res.Signal, res.OOMKills = st.ExitCode, st.Signal, st.OOMKills
	if err := s.send(c.id, agentproto.KindExit, res, nil); err != nil {
		s.log.Warn("send exit", "id", c.id, "err", err)
	}
	return nil
}

func startError(name, prog string, err error) error {
	var coded *errcode.Error
	switch {
	case errors.As(err, &coded):
		return coded
	case errors.Is(err, os.ErrNotExist):
		return errcode.Errorf(errcode.NotFound, "program %q (%s) does not exist", name, prog)
	case errors.Is(err, os.ErrPermission):
		return errcode.Errorf(errcode.InvalidArgument, "program %q (%s) is not executable: %w", name, prog, err)
	case errors.Is(err, syscall.ENOEXEC):
		return errcode.Errorf(errcode.InvalidArgument, "program %q (%s) is not a valid executable (a script needs a #! line)", name, prog)
	case errors.Is(err, syscall.EAGAIN):
		return errcode.Errorf(errcode.Busy, "the sandbox is at its process limit; wait for running commands to end, or end background processes")
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENOENT):
		return errcode.Errorf(errcode.NotFound, "cannot start %q: %w", name, err)
	}
	return fmt.Errorf("cannot start %q: %v", name, err)
}
