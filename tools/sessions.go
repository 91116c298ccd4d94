package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// Sandbox is what a tool calls on a sandbox, and all it calls: the
// handlers depend on this, not on package session's types, so they can be
// tested without containers. *session.Sandbox is one.
type Sandbox interface {
	ID() string
	Owner() string
	Exec(ctx context.Context, req session.ExecRequest) (session.ExecResult, error)
	Program(ctx context.Context, name, cwd string, shell bool) (session.Program, error)
	Job(ctx context.Context, req session.JobRequest) (session.JobResult, error)
	Jobs(ctx context.Context) ([]session.JobInfo, error)
	ReadFile(ctx context.Context, path string, offset, length, maxBytes int64) (session.ReadResult, error)
	Read(ctx context.Context, req session.ReadRequest) (session.ReadResult, error)
	WriteFileFrom(ctx context.Context, path string, r io.Reader, size int64, appendTo bool, mode uint32) (session.WriteResult, error)
	EditFile(ctx context.Context, path string, edits []session.Edit, maxFile int64) (session.EditResult, error)
	Delete(ctx context.Context, path string, recursive bool) (session.DeleteResult, error)
	Move(ctx context.Context, from, to string, overwrite bool) (session.MoveResult, error)
	List(ctx context.Context, path string, o session.ListOptions) (session.ListResult, error)
	Snapshot(ctx context.Context, label string) (snapshot.Info, error)
	Restore(ctx context.Context, id string) (snapshot.Info, session.RestoreResult, error)
	// TakeNotice returns, once, what the next result must tell about
	// how the sandbox came back (its container removed, then started
	// again from its saved workspace), or "".
	TakeNotice() string
}

var _ Sandbox = (*session.Sandbox)(nil)

// Sandboxes is what the tools ask of the sandbox registry: a session's own
// sandbox (made on first use), a sandbox by id, the end of a session's
// sandbox, and the snapshot store. ManagerSandboxes adapts a
// *session.Manager.
type Sandboxes interface {
	// Sandbox returns the sandbox of key, making it on first use for owner.
	Sandbox(key, owner string) (Sandbox, error)
	// Lookup finds owner's sandbox id; another owner's is NOT_FOUND, as
	// one never made.
	Lookup(id, owner string) (Sandbox, error)
	// Release removes key's sandbox, if any.
	Release(key string)
	// ReleaseSoon starts the removal of key's sandbox and reports
	// whether there was one.
	ReleaseSoon(key string) bool
	// Snapshots returns the snapshot store; the tools see a caller's
	// snapshots only, through its view (Snapshots().For).
	Snapshots() *snapshot.Store
}

// ManagerSandboxes returns m as the tools' Sandboxes.
func ManagerSandboxes(m *session.Manager) Sandboxes { return managerSandboxes{m} }

type managerSandboxes struct{ *session.Manager }

func (m managerSandboxes) Sandbox(key, owner string) (Sandbox, error) {
	sb, err := m.Manager.Sandbox(key, owner)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (m managerSandboxes) Peek(key string) (Sandbox, bool) {
	sb, ok := m.Manager.Peek(key)
	if !ok {
		return nil, false
	}
	return sb, true
}

func (m managerSandboxes) Lookup(id, owner string) (Sandbox, error) {
	sb, err := m.Manager.Find(id, owner)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// Sessionless is the rule for a call without `sandbox` on MCP 2026-07-28,
// which has no protocol sessions (SEP-2567). On older versions such a call
// always uses its MCP session's own sandbox.
type Sessionless int

const (
	// SessionlessConnection: the connection's sandbox. Over stdio the
	// server has one MCP session for the whole connection, whatever the
	// version, so its sandbox is the session's, made and ended as on older
	// versions.
	SessionlessConnection Sessionless = iota
	// SessionlessNone: there is no implicit sandbox; the call is refused
	// with INVALID_ARGUMENT saying to make one and name it. Over HTTP
	// each 2026-07-28 request is served on a session of its own that ends
	// with it: nothing outlives the request there.
	SessionlessNone
	// SessionlessPerCaller: each caller has one default sandbox, made at
	// its first such call and kept until the server exits (its container
	// goes when idle, and comes back from its snapshot at the next call).
	// It is never tied to an MCP session. (--default-sandbox=per-caller)
	SessionlessPerCaller
)

// String names the rule as the policy resource shows it.
func (r Sessionless) String() string {
	switch r {
	case SessionlessNone:
		return "none"
	case SessionlessPerCaller:
		return "per-caller"
	}
	return "connection"
}

// Sessions maps MCP sessions to sandboxes. It is the only place that knows
// both: session keys are opaque strings to package session.
type Sessions struct {
	m Sandboxes
	// OwnerOf names the caller of a request ("" when there is no
	// authentication, as on stdio). Nil means "".
	OwnerOf func(*mcp.RequestExtra) string
	// Sessionless is the rule for calls without `sandbox` on MCP
	// 2026-07-28 (the zero value, SessionlessConnection, is stdio's).
	Sessionless Sessionless

	mu   sync.Mutex
	keys map[*mcp.ServerSession]string
	// owners maps the key of each session seen to its caller, so End can
	// tell whether a caller may end a session.
	owners map[string]string
}

// NewSessions returns a Sessions over m.
func NewSessions(m *session.Manager) *Sessions { return SessionsOver(ManagerSandboxes(m)) }

// SessionsOver returns a Sessions over a registry of sandboxes.
func SessionsOver(sbs Sandboxes) *Sessions {
	return &Sessions{m: sbs, keys: make(map[*mcp.ServerSession]string), owners: make(map[string]string)}
}

// snapshotsOf returns owner's view of the snapshot store: another caller's
// snapshots do not exist in it.
func (s *Sessions) snapshotsOf(owner string) *snapshot.View { return s.m.Snapshots().For(owner) }

// Owner names the caller of a tool call.
func (s *Sessions) Owner(req *mcp.CallToolRequest) string {
	if s.OwnerOf == nil {
		return ""
	}
	return s.OwnerOf(req.Extra)
}

// key returns the sandbox key of an MCP session, and on first sight notes
// its caller and starts watching the session so its sandbox is removed
// when it ends. The SDK binds an HTTP session to the caller that opened it,
// so the first caller seen is the session's.
func (s *Sessions) key(ss *mcp.ServerSession, owner string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.keys[ss]; ok {
		return k
	}
	k := fmt.Sprintf("mcp-%p", ss)
	if id := ss.ID(); id != "" {
		k = keyOf(id)
	}
	s.keys[ss] = k
	s.owners[k] = owner
	go func() {
		_ = ss.Wait()
		s.m.Release(k)
		s.mu.Lock()
		delete(s.keys, ss)
		delete(s.owners, k)
		s.mu.Unlock()
	}()
	return k
}

// existing returns the MCP session's own sandbox if it has one, without
// making one.
func (s *Sessions) existing(ss *mcp.ServerSession) (Sandbox, bool) {
	p, ok := s.m.(interface{ Peek(string) (Sandbox, bool) })
	if !ok || ss == nil {
		return nil, false
	}
	s.mu.Lock()
	k, ok := s.keys[ss]
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	return p.Peek(k)
}

// keyOf returns the sandbox key of an HTTP session id (see key).
func keyOf(sessionID string) string { return "mcp-" + sessionID }

// defaultKey returns the sandbox key of owner's default sandbox
// (SessionlessPerCaller). It is no session's key, so no session's end
// releases it.
func defaultKey(owner string) string { return "default-" + owner }

// End ends the calls in flight of the HTTP session sessionID and starts the
// removal of its sandbox, if owner is the session's caller; the container
// goes in the background (the server waits for it at shutdown), so a DELETE
// is answered without waiting for the engine. The SDK's own session close
// waits for calls in flight without cancelling them, so the HTTP server
// calls End on DELETE first. It reports whether there was a sandbox to
// remove: a session that made no tool call has none, and another caller's
// session is left alone.
func (s *Sessions) End(sessionID, owner string) bool {
	k := keyOf(sessionID)
	s.mu.Lock()
	o, ok := s.owners[k]
	s.mu.Unlock()
	if !ok || o != owner {
		return false
	}
	return s.m.ReleaseSoon(k)
}

// sandbox returns the sandbox a call runs in: the one the call names in
// its sandbox argument, which must belong to the same caller, or else the
// implicit one: its MCP session's own, or on 2026-07-28 the one the
// Sessionless rule gives.
func (s *Sessions) sandbox(c *call, named string) (Sandbox, error) {
	owner := s.Owner(c.req)
	if c.req.Session == nil {
		return nil, errors.New("tools: call without a session")
	}
	rule := SessionlessConnection
	if sessionless(c.req) {
		rule = s.Sessionless
	}
	if named != "" {
		// A call naming a sandbox does not make one for its session.
		sb, err := c.named, c.namedErr
		if !c.looked {
			sb, err = s.m.Lookup(named, owner)
		}
		if err != nil {
			return nil, err
		}
		c.sandbox = sb.ID()
		return sb, nil
	}
	var key string
	switch rule {
	case SessionlessNone:
		return nil, errcode.Errorf(errcode.InvalidArgument,
			"this call names no sandbox, and on MCP 2026-07-28 over HTTP there is no session to give it one: "+
				"create a sandbox with sandbox_create and pass the handle it returns in \"sandbox\" on every call")
	case SessionlessPerCaller:
		// Keyed by caller, never by the request's session: over HTTP
		// that session ends with the request.
		key = defaultKey(owner)
	default:
		key = s.key(c.req.Session, owner)
	}
	own, err := s.m.Sandbox(key, owner)
	if err != nil {
		return nil, err
	}
	c.sandbox = own.ID()
	return own, nil
}
