package tools

import (
	"errors"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// Sessions maps MCP sessions to sandboxes. It is the only place that knows
// both: session keys are opaque strings to package session.
type Sessions struct {
	m *session.Manager
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
func NewSessions(m *session.Manager) *Sessions {
	return &Sessions{m: m, keys: make(map[*mcp.ServerSession]string), owners: make(map[string]string)}
}

// Manager returns the session manager.
func (s *Sessions) Manager() *session.Manager { return s.m }

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
		k = KeyOf(id)
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

// KeyOf returns the sandbox key of an HTTP session id (see key).
func KeyOf(sessionID string) string { return "mcp-" + sessionID }

// End ends the calls in flight of the HTTP session sessionID and starts the
// removal of its sandbox, if owner is the session's caller; the container
// goes in the background (the server waits for it at shutdown), so a DELETE
// is answered without waiting for the engine. The SDK's own session close
// waits for calls in flight without cancelling them, so the HTTP server
// calls End on DELETE first. It reports whether there was a sandbox to
// remove: a session that made no tool call has none, and another caller's
// session is left alone.
func (s *Sessions) End(sessionID, owner string) bool {
	k := KeyOf(sessionID)
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
func (s *Sessions) sandbox(c *call, named string) (*session.Sandbox, error) {
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
