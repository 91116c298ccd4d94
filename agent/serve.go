package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/workspace"
)

// Options configure Serve.
type Options struct {
	// Workspace is the directory file operations are confined to.
	Workspace string
	// Env is the base environment of every command (NAME=VALUE). The
	// request's variables and PWD are added to it.
	Env []string
	// User is the sandbox user commands run as. Required; the process must
	// have been through DropPrivileges(User), unless Unprivileged is set.
	User User
	// Unprivileged says the agent itself runs as User, with no capability
	// at all (a Kubernetes pod under the Pod Security "restricted" profile,
	// which allows adding none). Commands then start as the agent's own
	// user, and the kill-tree finds a command's processes by the process
	// tree instead of by a supplementary group of their own (which takes
	// CAP_SETGID to give). The agent is then within reach of the code it
	// runs: the pod is the only boundary.
	Unprivileged bool
	// Path is the list of directories programs are looked up in. Relative
	// entries and entries inside the workspace are ignored.
	Path []string
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
}

// server is one protocol connection.
type server struct {
	opts   Options
	ws     *workspace.Workspace
	log    *slog.Logger
	groups *groupPool

	// envMu guards env and path: the base environment of every command
	// and the program search path, which a setup request may extend.
	envMu sync.RWMutex
	env   []string
	path  []string

	wmu sync.Mutex
	w   *agentproto.Writer

	mu    sync.Mutex
	calls map[uint64]*call

	// root is Serve's context: background jobs live as long as it does.
	root context.Context
	jobs *jobTable

	ports atomic.Int64 // port streams open

	lastFrame atomic.Int64  // unix nanos of the last frame received
	leaseTTL  atomic.Int64  // nanos; 0 = no lease
	leaseSet  chan struct{} // a lease came: watchLease looks again
	wg        sync.WaitGroup

	// in reads the server's frames (see input): with the lease's token it
	// survives a server that is gone and resynchronises with the next.
	in *input
	// resynced is set by a resync marker: the next frame is a new
	// server's KindResume. Only the dispatch loop touches it.
	resynced bool
	// hello is what the agent said of itself, said again to a server
	// that resumes.
	hello agentproto.Hello
}

// call is a request in flight.
type call struct {
	id     uint64
	cancel context.CancelFunc
	// in receives the request's data frames (stdin, file content, tar);
	// nil when the request takes none.
	in *inbox
	// detach is closed when the server detaches the request (an exec:
	// see agentproto.KindDetach); nil for other requests.
	detach     chan struct{}
	detachOnce sync.Once
	// port is the relay of a port stream; nil for other requests.
	port *portRelay
}

// ErrLeaseExpired is why Serve ends when no frame came from the server for
// the lease the server gave.
var ErrLeaseExpired = errors.New("the server was silent for longer than its lease")

// Serve runs the protocol on in and out until in reaches EOF, the lease runs
// out (an error wrapping ErrLeaseExpired), or ctx ends. It returns nil on a
// clean EOF.
func Serve(ctx context.Context, in io.Reader, out io.Writer, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := opts.User.check(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	groups := &groupPool{}
	if !opts.Unprivileged {
		g, err := newGroupPool(opts.User)
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		groups = g
	} else if r, e, sv := unix.Getresuid(); r != opts.User.UID || e != opts.User.UID || sv != opts.User.UID {
		return fmt.Errorf("agent: unprivileged, the agent must run as the sandbox user %d; it runs as %d %d %d", opts.User.UID, r, e, sv)
	}
	if _, ok := readStatus(os.Getpid()); !ok {
		log.Warn("/proc/<pid>/status shows no supplementary groups here (a runtime that emulates /proc?); a timeout or cancel kills only a command's process group")
	}
	ws, err := workspace.Open(opts.Workspace)
	if err != nil {
		return fmt.Errorf("agent: open workspace: %w", err)
	}
	defer ws.Close()

	s := &server{
		opts:   opts,
		ws:     ws,
		log:    log,
		env:    opts.Env,
		path:   cleanSearchPath(opts.Path, opts.Workspace),
		groups: groups,
		w:      agentproto.NewWriter(out),
		calls:  make(map[uint64]*call),
		jobs:   newJobTable(),

		leaseSet: make(chan struct{}, 1),
	}
	s.lastFrame.Store(time.Now().UnixNano())

	r, e, sv := unix.Getresuid()
	rg, eg, sg := unix.Getresgid()
	s.hello = agentproto.Hello{
		Version: agentproto.Version, Agent: "sandbox-agent " + Version(), PID: os.Getpid(), UID: e, Workspace: opts.Workspace,
		UIDs: [3]int{r, e, sv}, GIDs: [3]int{rg, eg, sg},
		CommandUID: opts.User.UID, CommandGID: opts.User.GID,
		CommandGroups: [2]uint32{groups.first, groups.count},
	}
	if err := s.send(0, agentproto.KindHello, s.hello, nil); err != nil {
		return fmt.Errorf("agent: send hello: %w", err)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.root = ctx
	go s.watchLease(ctx, cancel)

	frames := make(chan agentproto.Frame)
	readErr := make(chan error, 1)
	s.in = newInput(in, agentproto.FrameStall, log)
	go func() {
		for {
			f, err := s.in.next()
			if err != nil {
				readErr <- err
				return
			}
			select {
			case frames <- f:
			case <-ctx.Done():
				readErr <- context.Cause(ctx)
				return
			}
		}
	}()

	for {
		select {
		case f := <-frames:
			s.lastFrame.Store(time.Now().UnixNano())
			s.dispatch(ctx, f)
		case err := <-readErr:
			s.stopAll()
			if errors.Is(err, io.EOF) {
				log.Info("server closed the stream")
				return nil
			}
			return fmt.Errorf("agent: read frame: %w", err)
		case <-ctx.Done():
			s.stopAll()
			return fmt.Errorf("agent: %w", context.Cause(ctx))
		}
	}
}

// leaseWakeups counts watchLease's turns, every agent in the process
// together (its test reads it).
var leaseWakeups atomic.Int64

// watchLease ends the agent when the server has been silent for the lease.
// It sleeps until the lease could first run out (the last frame plus the
// lease) rather than waking on a fixed tick: an idle agent then wakes about
// once per server ping instead of four times a second, which a host holding
// a thousand idle sandboxes pays for in CPU. Without a lease it waits for
// one (leaseSet).
func (s *server) watchLease(ctx context.Context, cancel context.CancelCauseFunc) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		leaseWakeups.Add(1)
		var wake <-chan time.Time
		if ttl := s.leaseTTL.Load(); ttl > 0 {
			left := time.Duration(s.lastFrame.Load() + ttl - time.Now().UnixNano())
			if left < 0 {
				s.log.Warn("lease expired; ending the sandbox", "ttl", time.Duration(ttl))
				cancel(fmt.Errorf("%w (%s)", ErrLeaseExpired, time.Duration(ttl)))
				return
			}
			t.Reset(left + time.Millisecond)
			wake = t.C
		}
		select {
		case <-ctx.Done():
			return
		case <-s.leaseSet:
		case <-wake:
		}
	}
}

// stopAll cancels every request in flight, waits for them to finish and
// kills every job's processes, so nothing the agent started outlives it.
func (s *server) stopAll() {
	s.mu.Lock()
	for _, c := range s.calls {
		c.cancel()
		if c.in != nil {
			c.in.close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.jobs.killAll()
}

func (s *server) send(id uint64, kind agentproto.Kind, body any, payload []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.w.Write(id, kind, body, payload)
}

// maxErrorMessage bounds the message of an error frame, so that it fits a
// frame however it is escaped (a message may quote a request's path).
const maxErrorMessage = 4 << 10

// sendError ends a request with an error frame. Errors that are not
// *errcode.Error go as INTERNAL (see agentproto.ErrorOf).
func (s *server) sendError(id uint64, err error) {
	pe := agentproto.ErrorOf(err)
	if len(pe.Message) > maxErrorMessage {
		pe.Message = strings.ToValidUTF8(pe.Message[:maxErrorMessage], "") + "..."
	}
	if werr := s.send(id, agentproto.KindError, pe, nil); werr != nil {
		s.log.Warn("send error frame", "id", id, "err", werr)
	}
}

func (s *server) dispatch(ctx context.Context, f agentproto.Frame) {
	resynced := s.resynced
	s.resynced = false
	switch f.Kind {
	case kindResynced:
		s.resynced = true
	case agentproto.KindResume:
		if !resynced || f.ID != 0 {
			s.sendError(f.ID, errcode.Errorf(errcode.InvalidArgument, "a resume must come right after a resync marker, on id 0"))
			return
		}
		var r agentproto.Resume
		if err := f.Decode(&r); err != nil {
			s.sendError(f.ID, errcode.Errorf(errcode.InvalidArgument, "%w", err))
			return
		}
		s.resume(r)
	case agentproto.KindLease:
		var l agentproto.Lease
		if err := f.Decode(&l); err == nil && l.TTLMillis >= 0 {
			s.leaseTTL.Store(int64(time.Duration(l.TTLMillis) * time.Millisecond))
			select {
			case s.leaseSet <- struct{}{}:
			default:
			}
			if l.Token != "" {
				s.in.setToken(l.Token)
			}
		}
	case agentproto.KindPing:
		if err := s.send(f.ID, agentproto.KindPong, nil, nil); err != nil {
			s.log.Warn("send pong", "err", err)
		}
	case agentproto.KindData, agentproto.KindEOF:
		s.mu.Lock()
		c := s.calls[f.ID]
		s.mu.Unlock()
		if c == nil || c.in == nil {
			return // the request already ended; late data is dropped
		}
		if f.Kind == agentproto.KindEOF {
			c.in.close()
		} else {
			c.in.push(f.Payload)
		}
	case agentproto.KindPortData, agentproto.KindPortAck, agentproto.KindPortClose:
		s.mu.Lock()
		c := s.calls[f.ID]
		s.mu.Unlock()
		if c != nil && c.port != nil {
			c.port.deliver(f)
		}
	case agentproto.KindPortOpen:
		var req agentproto.PortOpenRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			s.portOpen(ctx, c, req)
		})
	case agentproto.KindCancel:
		s.mu.Lock()
		c := s.calls[f.ID]
		s.mu.Unlock()
		if c != nil {
			c.cancel()
		}
	case agentproto.KindDetach:
		s.mu.Lock()
		c := s.calls[f.ID]
		s.mu.Unlock()
		if c != nil && c.detach != nil {
			c.detachOnce.Do(func() { close(c.detach) })
		}
	case agentproto.KindExec:
		var req agentproto.ExecRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			s.exec(ctx, c, req)
		})
	case agentproto.KindJob:
		var req agentproto.JobRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			s.jobOp(ctx, c, req)
		})
	case agentproto.KindJobs:
		var req agentproto.JobsRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			s.listJobs(c)
		})
	case agentproto.KindRead:
		var req agentproto.ReadRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			dst := &chunkWriter{s: s, id: c.id}
			var res agentproto.ReadResult
			var err error
			if req.StartLine > 0 {
				if req.Offset != 0 || req.Length != 0 {
					err = errcode.Errorf(errcode.InvalidArgument, "read %q: give lines or a byte range, not both", req.Path)
				} else {
					res, err = s.ws.ReadLines(ctx, req.Path, workspace.Lines{Start: req.StartLine, End: req.EndLine, Max: req.Max,
						MaxScan: req.MaxScan, MaxLineChars: req.MaxLineChars}, dst)
				}
			} else {
				res, err = s.ws.ReadFile(ctx, req.Path, req.Offset, req.Length, req.Max, dst)
			}
			s.finish(c.id, res, err)
		})
	case agentproto.KindEdit:
		var req agentproto.EditRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			edits := req.Edits
			if len(edits) == 0 {
				edits = []agentproto.EditSpec{{OldSize: req.OldSize, NewSize: req.NewSize, ReplaceAll: req.ReplaceAll}}
			}
			var res agentproto.EditResult
			var err error
			if len(req.Edits) > 0 && (req.OldSize != 0 || req.NewSize != 0 || req.ReplaceAll) {
				err = errcode.Errorf(errcode.InvalidArgument, "edit %q: give one edit or a list of edits, not both", req.Path)
			} else {
				res, err = s.ws.EditFile(ctx, req.Path, c.in, edits, req.MaxFile)
			}
			c.in.abort(err)
			s.finish(c.id, res, err)
		})
	case agentproto.KindDelete:
		var req agentproto.DeleteRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			res, err := s.ws.Delete(req.Path, req.Recursive)
			s.finish(c.id, res, err)
		})
	case agentproto.KindMove:
		var req agentproto.MoveRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			res, err := s.ws.Move(req.From, req.To, req.Overwrite)
			s.finish(c.id, res, err)
		})
	case agentproto.KindWrite:
		var req agentproto.WriteRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			res, err := s.ws.WriteFile(req.Path, c.in, req.Size, req.Append, req.Mode)
			c.in.abort(err)
			s.finish(c.id, res, err)
		})
	case agentproto.KindList:
		var req agentproto.ListRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			lw := &entryWriter{cw: chunkWriter{s: s, id: c.id}}
			res, err := s.ws.List(ctx, req.Path, workspace.ListOptions{Recursive: req.Recursive, Max: req.Max,
				Pattern: req.Pattern, Prune: req.Prune, MaxScan: req.MaxScan}, lw.emit)
			if err == nil {
				err = lw.flush()
			}
			s.finish(c.id, res, err)
		})
	case agentproto.KindResolve:
		var req agentproto.ResolveRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			res := agentproto.ResolveResult{Paths: make([]string, len(req.Names))}
			for i, n := range req.Names {
				res.Paths[i], _ = s.resolve(n, req.Cwd)
			}
			s.finish(c.id, res, nil)
		})
	case agentproto.KindSnapshot:
		var req agentproto.SnapshotRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			dst := &chunkWriter{s: s, id: c.id, ctx: ctx}
			res, err := s.ws.Snapshot(dst, req.Limits)
			s.finish(c.id, res, err)
		})
	case agentproto.KindSetup:
		var req agentproto.SetupRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			res, err := s.setup(req)
			s.finish(c.id, res, err)
		})
	case agentproto.KindRestore:
		var req agentproto.RestoreRequest
		s.start(ctx, f, &req, func(ctx context.Context, c *call) {
			res, err := s.ws.Restore(c.in, req.Limits)
			c.in.abort(err)
			s.finish(c.id, res, err)
		})
	default:
		s.sendError(f.ID, errcode.Errorf(errcode.InvalidArgument, "unknown request kind %q", f.Kind))
	}
}

// start decodes a request body into req and runs fn in its own goroutine,
// registered under the frame's id until it returns. Requests followed by data
// frames get an inbox for them. fn must send the terminal frame.
func (s *server) start(ctx context.Context, f agentproto.Frame, req any, fn func(context.Context, *call)) {
	if err := f.Decode(req); err != nil {
		s.sendError(f.ID, errcode.Errorf(errcode.InvalidArgument, "%w", err))
		return
	}
	withInput, detachable := false, false
	switch r := req.(type) {
	case *agentproto.ExecRequest:
		withInput, detachable = r.Stdin, !r.Background
	case *agentproto.WriteRequest, *agentproto.EditRequest, *agentproto.RestoreRequest:
		withInput = true
	}
	cctx, cancel := context.WithCancel(ctx)
	if t := f.Timeout(); t > 0 {
		// The server waits this long for the answer, then gives up: the
		// work stops here too, whether its cancel frame arrives or not.
		tctx, stop := context.WithTimeout(cctx, t)
		parent := cancel
		cctx, cancel = tctx, func() { stop(); parent() }
	}
	c := &call{id: f.ID, cancel: cancel}
	if withInput {
		c.in = newInbox()
		// A request stopped while it waits for its input stops waiting.
		in := c.in
		context.AfterFunc(cctx, func() { in.abort(errcode.Errorf(errcode.Timeout, "the request was stopped before its input arrived")) })
	}
	if detachable {
		c.detach = make(chan struct{})
	}
	if _, ok := req.(*agentproto.PortOpenRequest); ok {
		c.port = newPortRelay()
	}
	s.mu.Lock()
	if _, dup := s.calls[f.ID]; dup {
		s.mu.Unlock()
		cancel()
		s.sendError(f.ID, errcode.Errorf(errcode.InvalidArgument, "request id %d is already in use", f.ID))
		return
	}
	s.calls[f.ID] = c
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.calls, c.id)
			s.mu.Unlock()
			cancel()
			if c.in != nil {
				c.in.close()
			}
		}()
		fn(cctx, c)
	}()
}

// finish sends a request's terminal frame: result or error.
func (s *server) finish(id uint64, res any, err error) {
	if err != nil {
		s.sendError(id, err)
		return
	}
	if err := s.send(id, agentproto.KindResult, res, nil); err != nil {
		s.log.Warn("send result", "id", id, "err", err)
		if errors.Is(err, agentproto.ErrNotSent) {
			// The request still gets its terminal frame.
			s.sendError(id, fmt.Errorf("the result could not be sent: %v", err))
		}
	}
}
