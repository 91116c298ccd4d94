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
		for _, d := range s.searchPath() {
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
		"program %q was not found on the sandbox's PATH (%s); check the name, or give a path", name, strings.Join(s.searchPath(), ":"))
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
// the terminal frame itself. Its steps: prepare (what the request names),
// newPipes, startCommand, then for a foreground command follow (wait, detach,
// drain).
func (s *server) run(ctx context.Context, c *call, req agentproto.ExecRequest) error {
	l, err := s.prepare(c, req)
	if err != nil {
		return err
	}
	defer l.dir.Close()
	p, err := newPipes()
	if err != nil {
		return err
	}
	r, err := s.startCommand(ctx, c, req, l, p)
	if err != nil {
		return err
	}
	if req.Background {
		go func() { _, _ = r.wait() }()
		r.j.mu.Lock()
		st := r.j.statusLocked()
		r.j.mu.Unlock()
		s.finish(c.id, st, nil)
		return nil
	}
	return r.follow()
}

// launch is what a command needs before it starts.
type launch struct {
	prog  string   // the program executed
	dir   *os.File // the working directory, opened in the workspace
	stdin []byte   // the request's stdin, collected whole
	group uint32   // the command's own group (0 unprivileged)
	env   []string
	label string
}

// prepare resolves the program, opens the working directory, collects
// stdin and takes a group: everything that can be refused before a pipe is
// made.
func (s *server) prepare(c *call, req agentproto.ExecRequest) (*launch, error) {
	if len(req.Argv) == 0 {
		return nil, errcode.Errorf(errcode.InvalidArgument, "argv is empty")
	}
	l := &launch{prog: req.Path, label: jobLabel(req.Label), env: execEnv(s.baseEnv(), req.Env, s.opts.Workspace, req.Cwd)}
	if l.prog == "" {
		p, err := s.resolve(req.Argv[0], req.Cwd)
		if err != nil {
			return nil, err
		}
		l.prog = p
	}
	dir, err := s.ws.OpenDir(req.Cwd)
	if err != nil {
		return nil, err
	}
	// Collect stdin before starting: the server sends it right behind the
	// request, and the inbox never blocks the frame reader.
	if c.in != nil {
		l.stdin, err = io.ReadAll(io.LimitReader(c.in, maxExecStdin+1))
		if err != nil {
			dir.Close()
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		if len(l.stdin) > maxExecStdin {
			dir.Close()
			return nil, errcode.Errorf(errcode.TooLarge, "stdin is larger than %d bytes; write it to a file and redirect it", maxExecStdin)
		}
	}
	if !s.opts.Unprivileged {
		g, err := s.groups.take()
		if err != nil {
			dir.Close()
			return nil, errcode.Errorf(errcode.Busy, "%w", err)
		}
		l.group = g
	}
	l.dir = dir
	return l, nil
}

// execEnv is a command's environment: the agent's base, the request's
// variables, and PWD, the working directory as the sandbox sees it.
func execEnv(base, extra []string, workspace, cwd string) []string {
	env := make([]string, 0, len(base)+len(extra)+1)
	env = append(env, base...)
	env = append(env, extra...)
	return append(env, "PWD="+path.Join(workspace, cwd))
}

// jobLabel cuts a job's label to maxLabel bytes, on a character boundary,
// marking the cut.
func jobLabel(label string) string {
	if len(label) > maxLabel {
		label = strings.ToValidUTF8(label[:maxLabel], "") + "..."
	}
	return label
}

// liveChunk is the part of p that may still be streamed live when sent
// bytes of the stream went already and at most limit may.
func liveChunk(limit, sent int64, p []byte) []byte {
	room := limit - sent
	if room <= 0 {
		return nil
	}
	return p[:min(int64(len(p)), room)]
}

// stopCause says why a command that was stopped (its run context ended)
// stopped: a foreground command (not background) whose request ended was
// cancelled; otherwise it timed out, unless it is a background job whose
// connection ended, which is neither.
func stopCause(requestEnded, background, connectionEnded bool) (cancelled, timedOut bool) {
	if requestEnded && !background {
		return true, false
	}
	return false, !connectionEnded || !background
}

// pipes are a command's stdout, stderr and stdin: the command's ends (outW,
// errW, inR) and the agent's.
type pipes struct {
	outR, outW, errR, errW, inR, inW *os.File
}

// newPipes makes the three pipes; on failure it closes what it made.
func newPipes() (*pipes, error) {
	var p pipes
	for _, m := range []struct {
		name string
		r, w **os.File
	}{{"stdout", &p.outR, &p.outW}, {"stderr", &p.errR, &p.errW}, {"stdin", &p.inR, &p.inW}} {
		r, w, err := os.Pipe()
		if err != nil {
			p.closeAll()
			return nil, fmt.Errorf("%s pipe: %w", m.name, err)
		}
		*m.r, *m.w = r, w
	}
	return &p, nil
}

// closeAll closes every end made.
func (p *pipes) closeAll() {
	for _, f := range []*os.File{p.outR, p.outW, p.errR, p.errW, p.inR, p.inW} {
		if f != nil {
			f.Close()
		}
	}
}

// running is a started command and what the steps after its start share.
type running struct {
	s   *server
	c   *call
	ctx context.Context // the request's
	req agentproto.ExecRequest
	j   *job
	cmd *exec.Cmd
	p   *pipes

	group         uint32
	started       time.Time
	killedAtStart bool
	runCtx        context.Context
	cancelRun     func()
	// keepWithRequest detaches the command from its request's context; it
	// reports false if the request ended first.
	keepWithRequest func() bool
	detached        atomic.Bool
	waited          chan error
	readers         sync.WaitGroup
	// sent counts the output streamed live (under j.mu).
	sent [2]int64
}

// startCommand makes the command's job, starts it as the sandbox user in its own
// group with its timeout running, and starts the goroutines that pump its
// output, feed its stdin and wait for it. On failure it closes the pipes
// and forgets the job.
func (s *server) startCommand(ctx context.Context, c *call, req agentproto.ExecRequest, l *launch, p *pipes) (*running, error) {
	oomBase, ok := oomKills()
	if !ok {
		oomBase = -1
	}
	r := &running{s: s, c: c, ctx: ctx, req: req, p: p, group: l.group, waited: make(chan error, 1)}
	j := &job{
		id: req.Job, label: l.label, started: time.Now(), group: l.group, oomBase: oomBase, unprivileged: s.opts.Unprivileged,
		stdin: p.inW, stdinSem: make(chan struct{}, 1),
		out:     [2]ring{newRing(req.KeepOutput), newRing(req.KeepOutput)},
		changed: make(chan struct{}),
		readers: []*os.File{p.outR, p.errR},
	}
	r.j = j
	if !req.Background {
		kinds := [2]agentproto.Kind{agentproto.KindStdout, agentproto.KindStderr}
		j.live = func(stream int, b []byte) {
			if chunk := liveChunk(req.MaxOutput, r.sent[stream], b); len(chunk) > 0 {
				if s.send(c.id, kinds[stream], nil, chunk) == nil {
					r.sent[stream] += int64(len(chunk))
				}
			}
		}
	}
	if req.Job != 0 {
		if err := s.jobs.add(j, req.MaxJobs); err != nil {
			p.closeAll()
			return nil, err
		}
	}

	r.cmd = &exec.Cmd{
		Path:   l.prog,
		Args:   req.Argv,
		Env:    l.env,
		Stdin:  p.inR,
		Stdout: p.outW,
		Stderr: p.errW,
		// The directory fd is inherited across fork and closed at execve
		// (O_CLOEXEC); the child's chdir goes through it, so the directory
		// checked is the directory entered, whatever happens to its path.
		Dir:         fmt.Sprintf("/proc/self/fd/%d", l.dir.Fd()),
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	// A command lives as long as the connection, and a foreground one
	// until its request is cancelled too, unless the server detaches it
	// first: it then runs on as a background job.
	life, endLife := context.WithCancel(s.root)
	r.keepWithRequest = func() bool { return false }
	if !req.Background {
		r.keepWithRequest = context.AfterFunc(ctx, endLife)
	}
	// The timeout runs from here: a command can be stopped (by the sandbox
	// user, whose process it is as soon as it changed its ids) before it
	// executes its program, and then its start does not return. Its
	// timeout or cancel kills it there too.
	r.runCtx, r.cancelRun = life, endLife
	if req.TimeoutMillis > 0 {
		var cancelTimeout context.CancelFunc
		r.runCtx, cancelTimeout = context.WithTimeout(life, time.Duration(req.TimeoutMillis)*time.Millisecond)
		r.cancelRun = func() { cancelTimeout(); endLife() }
	}
	// Unprivileged, a command stopped before it executes its program is not
	// found here (its pid is not known yet); the stopped start then holds
	// the call until the sandbox ends.
	unwatch := context.AfterFunc(r.runCtx, func() { killTree(0, j.members(0)) })
	r.started = time.Now()
	var err error
	if s.opts.Unprivileged {
		err = r.cmd.Start()
	} else {
		err = startAs(r.cmd, s.opts.User, l.group)
	}
	r.killedAtStart = !unwatch()
	if err != nil {
		r.cancelRun()
		p.closeAll()
		s.jobs.remove(req.Job)
		return nil, startError(req.Argv[0], l.prog, err)
	}
	p.outW.Close()
	p.errW.Close()
	p.inR.Close()
	j.mu.Lock()
	j.pgid = r.cmd.Process.Pid
	j.mu.Unlock()

	r.readers.Add(2)
	go func() { defer r.readers.Done(); j.pump(0, p.outR) }()
	go func() { defer r.readers.Done(); j.pump(1, p.errR) }()
	// The first input goes in from its own goroutine: a command that does
	// not read it must not hold the call. A foreground command's stdin ends
	// after it; a background job's stays open for sandbox_job.
	go func() {
		j.stdinSem <- struct{}{}
		defer func() { <-j.stdinSem }()
		if len(l.stdin) > 0 && j.stdin != nil {
			_, _ = j.stdin.Write(l.stdin)
		}
		if !req.Background && j.stdin != nil {
			j.stdin.Close()
			j.stdin = nil
		}
	}()
	go func() { r.waited <- r.cmd.Wait() }()
	return r, nil
}

// wait waits for the command and records how it ended.
func (r *running) wait() (res agentproto.ExecResult, waitErr error) {
	// A foreground command is cancelled with its request, until it is
	// detached; else what stops it is its timeout (or the connection's
	// end, which is no timeout).
	stopped := func() {
		res.Cancelled, res.TimedOut = stopCause(r.ctx.Err() != nil, r.req.Background || r.detached.Load(), r.s.root.Err() != nil)
	}
	select {
	case waitErr = <-r.waited:
		if r.killedAtStart {
			stopped()
		}
	case <-r.runCtx.Done():
		stopped()
		pgid := r.cmd.Process.Pid
		res.Killed = killTree(pgid, r.j.members(pgid))
		waitErr = <-r.waited
	}
	res.DurationNano = int64(time.Since(r.started))
	r.cancelRun()
	if r.req.Background || r.detached.Load() {
		// A job reads as ended only once the output it wrote before it
		// exited is kept: its last bytes may still sit in the pipes when
		// it is reaped. (A foreground command drains in follow, before its
		// exit frame.)
		r.awaitOutput()
	}
	r.j.finish(r.cmd.ProcessState, res.TimedOut)
	// A process the command left behind may hold stdin: writers to it
	// give up now, and it is closed.
	_ = r.p.inW.SetWriteDeadline(time.Now())
	r.j.closeStdin()
	return res, waitErr
}

// follow waits for a foreground command, unless a detach frame makes it a
// background job first, drains its output and sends its exit frame.
func (r *running) follow() error {
	var res agentproto.ExecResult
	var waitErr error
	finished := make(chan struct{})
	go func() {
		res, waitErr = r.wait()
		close(finished)
	}()
	// A detach frame makes a command that still runs a background job: its
	// output is kept, and its next read starts after what went live. A
	// command cancelled or ended meanwhile answers as usual.
	detach := r.c.detach
	if r.req.Job == 0 {
		detach = nil
	}
	j := r.j
	select {
	case <-finished:
	case <-detach:
		j.mu.Lock()
		if !j.ended && r.keepWithRequest() {
			r.detached.Store(true)
			j.live = nil
			j.cursor = r.sent
			st := j.statusLocked()
			j.mu.Unlock()
			r.s.finish(r.c.id, st, nil)
			return nil
		}
		j.mu.Unlock()
		<-finished
	}
	res.PipesHeld = !r.drain(detach)
	j.mu.Lock()
	j.live = nil
	res.StdoutBytes, res.StderrBytes = j.out[0].total, j.out[1].total
	j.cursor = [2]int64{res.StdoutBytes, res.StderrBytes}
	st := j.status
	j.mu.Unlock()
	if r.cmd.ProcessState == nil {
		return fmt.Errorf("wait: %w", waitErr)
	}
	res.ExitCode, res.Signal, res.OOMKills = st.ExitCode, st.Signal, st.OOMKills
	if err := r.s.send(r.c.id, agentproto.KindExit, res, nil); err != nil {
		r.s.log.Warn("send exit", "id", r.c.id, "err", err)
	}
	return nil
}

// drain reads the output the command wrote before it exited, still in the
// pipes, and reports whether all of it came. Background processes may
// hold the pipes open: it stops waiting for them after a short grace. A
// kept job goes on reading what they write; a command run without a job
// drops it.
func (r *running) drain(detach <-chan struct{}) bool {
	done := make(chan struct{})
	go func() { r.readers.Wait(); close(done) }()
	group := r.group
	all := waitForOutput(done, r.ctx.Done(), detach, lingerGrace, drainCeiling, func() bool { return group == 0 || groupHasMembers(group) })
	if r.req.Job == 0 {
		r.p.outR.Close()
		r.p.errR.Close()
		if !all {
			<-done
		}
	}
	return all
}

// awaitOutput waits for a background job's readers to take what its
// command wrote, as drain does, but only as long as the agent serves: a
// process of the command that holds the pipes is waited for lingerGrace.
func (r *running) awaitOutput() {
	done := make(chan struct{})
	go func() { r.readers.Wait(); close(done) }()
	group := r.group
	waitForOutput(done, r.s.root.Done(), nil, lingerGrace, drainCeiling, func() bool { return group == 0 || groupHasMembers(group) })
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
