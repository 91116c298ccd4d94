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
}

var _ Sandbox = (*session.Sandbox)(nil)

// Sandboxes is what the tools ask of the sandbox registry: a session's own
// sandbox (made on first use), a sandbox by id, the end of a session's
// sandbox, and the snapshot store. ManagerSandboxes adapts a
// *session.Manager.
type Sandboxes interface {
	// Sandbox returns the sandbox of key, making it on first use for owner.
	Sandbox(key, owner string) (Sandbox, error)
	// Lookup finds owner's sandbox id; another owner's is not found.
	Lookup(id, owner string) (Sandbox, bool)
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

func (m managerSandboxes) Lookup(id, owner string) (Sandbox, bool) {
	sb, ok := m.Manager.Lookup(id, owner)
	if !ok {
		return nil, false
	}
	return sb, true
}

// Sessions maps MCP sessions to sandboxes. It is the only place that knows
// both: session keys are opaque strings to package session.
type Sessions struct {
	m Sandboxes
	// OwnerOf names the caller of a request ("" when there is no
	// authentication, as on stdio). Nil means "".
	OwnerOf func(*mcp.RequestExtra) string

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

// sandbox returns the sandbox a call runs in: the session's own, or the one
// the call names in its sandbox argument, which must belong to the same
// caller.
func (s *Sessions) sandbox(c *call, named string) (Sandbox, error) {
	owner := s.Owner(c.req)
	if c.req.Session == nil {
		return nil, errors.New("tools: call without a session")
	}
	if named != "" {
		// A call naming a sandbox does not make one for its session.
		sb, ok := s.m.Lookup(named, owner)
		if !ok {
			return nil, errcode.Errorf(errcode.NotFound,
				"no sandbox %q belongs to you; omit \"sandbox\" to use this session's own sandbox", named)
		}
		c.sandbox = sb.ID()
		return sb, nil
	}
	own, err := s.m.Sandbox(s.key(c.req.Session, owner), owner)
	if err != nil {
		return nil, err
	}
	c.sandbox = own.ID()
	return own, nil
}
