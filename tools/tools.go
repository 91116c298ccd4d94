// Package tools defines sandbox-mcp's MCP tools and resources: typed inputs
// and outputs, schemas, annotations, and handlers that decode, ask policy,
// call session, and render. It knows the session package's API, not Docker's.
//
// Errors follow one rule. A failure the model can act on is a tool result
// with isError set and a text that starts with one of the contract's codes
// (an *errcode.Error), then a colon, then what was wrong and what to do. A
// fault the model cannot act on is a JSON-RPC internal error, and its detail
// goes to the server log only.
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// Deps is what the tools need from the server.
type Deps struct {
	Policy policy.Policy
	// PolicyView is what the sandbox://policy resource shows.
	PolicyView PolicyView
	Sessions   *Sessions
	Logger     *slog.Logger
	// Audit, if set, receives one record per tool call.
	Audit func(Record)

	// budget bounds the memory of calls in flight, from Policy's
	// MaxInflightBytes and MaxSessionInflightBytes; All makes it.
	budget *budget
}

// Record describes one tool call, for the log and the audit log.
type Record struct {
	Time      time.Time `json:"time"`
	Caller    string    `json:"caller,omitempty"`
	Session   string    `json:"session,omitempty"`
	Sandbox   string    `json:"sandbox,omitempty"`
	Tool      string    `json:"tool"`
	ArgDigest string    `json:"arg_digest"`
	// Args are the call's arguments as received; the audit log records
	// only their keyed digest (AuditLog.Digest).
	Args     json.RawMessage `json:"-"`
	Decision string          `json:"decision"` // allow or deny
	Reason   string          `json:"reason,omitempty"`
	ExitCode *int            `json:"exit_code,omitempty"`
	Bytes    int64           `json:"bytes"`
	Duration float64         `json:"duration_ms"`
}

// call is the state of one tool call, filled in by its handler and logged
// by the wrapper.
type call struct {
	req     *mcp.CallToolRequest
	sandbox string
	bytes   int64
	exit    *int
	// held is the part of the memory budget the call holds (see
	// Deps.reserve); the wrapper gives it back once the result is sent.
	held *reservation
}

// CodeRequestCancelled is the JSON-RPC error code of the answer to a
// cancelled call, where the transport cannot leave it unanswered. MCP
// defines none; this is the code LSP uses for the same case.
const CodeRequestCancelled = -32800

// handler is a tool's logic: decode is done by the SDK; it asks policy,
// calls session and returns the output (and, rarely, a result of its own to
// carry content or isError beside the output). A failure the model can act
// on is an *errcode.Error; a result of its own with isError carries one too
// (CallToolResult.SetError), so codeErrors knows the result as the tool's.
type handler[In, Out any] func(ctx context.Context, c *call, in In) (*mcp.CallToolResult, Out, error)

// wrap turns a handler into an SDK handler that logs one record per call,
// feeds the audit log, and sorts errors into tool errors and protocol errors.
//
// The handler's output becomes the result's structured content as it is:
// the SDK, given a typed output, would marshal it, unmarshal that into a
// map to check it against the output schema (which is inferred from the same
// type), and marshal it again, three transient copies of a read's content.
// Returned as the result's value, it is encoded once, when the response is.
//
// The memory the call reserved is given back when ctx ends, which the SDK
// does once the response is written, not when the handler returns: the
// result is encoded and sent after that.
func wrap[In, Out any](d *Deps, name string, h handler[In, Out]) mcp.ToolHandlerFor[In, any] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		start := time.Now()
		c := &call{req: req}
		res, out, err := h(ctx, c, in)
		if c.held != nil {
			if err != nil {
				c.held.release() // an error carries no payload
			} else {
				context.AfterFunc(ctx, c.held.release)
			}
		}
		rec := Record{
			Time:     start.UTC(),
			Caller:   d.Sessions.Owner(req),
			Session:  sessionID(req),
			Sandbox:  c.sandbox,
			Tool:     name,
			Decision: "allow",
			ExitCode: c.exit,
			Bytes:    c.bytes,
			Duration: float64(time.Since(start).Microseconds()) / 1000,
		}
		coded, isCoded := errcode.As(err)
		switch {
		case err == nil:
			if res != nil && res.IsError {
				rec.Reason = "timed out"
			}
		case ctx.Err() != nil:
			// The client cancelled the call (or its HTTP request went
			// away): it gets no result. The SDK still answers, so the
			// answer is a protocol error, never a tool error the model
			// could mistake for the command's; the stdio transport drops
			// it.
			rec.Decision, rec.Reason = "deny", "cancelled"
			err = &jsonrpc.Error{Code: CodeRequestCancelled, Message: "sandbox-mcp: the call was cancelled; its command was stopped with every process it started"}
		case isCoded:
			// The model reads "CODE: message", without what wrapped it.
			err = coded
			rec.Decision, rec.Reason = "deny", err.Error()
		default:
			rec.Decision, rec.Reason = "deny", "internal error"
			d.Logger.Error("tool call failed", "tool", name, "sandbox", c.sandbox, "err", err)
			err = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "sandbox-mcp: internal error; the server log has the detail"}
		}
		attrs := []any{"tool", name, "session", rec.Session, "sandbox", rec.Sandbox, "decision", rec.Decision,
			"duration_ms", rec.Duration, "bytes", rec.Bytes}
		if rec.ExitCode != nil {
			attrs = append(attrs, "exit_code", *rec.ExitCode)
		}
		if rec.Reason != "" {
			attrs = append(attrs, "reason", rec.Reason)
		}
		d.Logger.Info("tool call", attrs...)
		if d.Audit != nil {
			// Hashing megabytes of arguments is work only the audit log does.
			rec.Args = req.Params.Arguments
			d.Audit(rec)
		}
		if err != nil {
			return nil, nil, err
		}
		if res == nil {
			res = &mcp.CallToolResult{}
		}
		if _, none := any(out).(noOutput); none {
			return res, nil, nil // a tool without an output schema
		}
		res.StructuredContent = out
		if res.Content == nil {
			// As the SDK does for a typed output: the JSON as text too.
			b, err := json.Marshal(out)
			if err != nil {
				return nil, nil, fmt.Errorf("tools: %s: marshal output: %w", name, err)
			}
			res.Content = []mcp.Content{&mcp.TextContent{Text: string(b)}}
		}
		return res, nil, nil
	}
}

// sessionID names the MCP session for logs: its id over HTTP, "stdio"
// otherwise.
func sessionID(req *mcp.CallToolRequest) string {
	if req.Session == nil {
		return ""
	}
	if id := req.Session.ID(); id != "" {
		return id
	}
	return "stdio"
}

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

// codeErrors makes every failed tool result start with a code. A failed
// result a tool made carries its *errcode.Error (see handler; the SDK keeps
// a handler's error on the result it makes of it). One without was made by
// the SDK itself, from checking the arguments against the input schema
// before any handler ran, and its message has no code: it is
// INVALID_ARGUMENT. The text is never parsed.
func codeErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		r, ok := res.(*mcp.CallToolResult)
		if !ok || err != nil || !r.IsError || len(r.Content) == 0 {
			return res, err
		}
		if _, coded := errcode.As(r.GetError()); coded {
			return res, err
		}
		if tc, ok := r.Content[0].(*mcp.TextContent); ok {
			tc.Text = string(errcode.InvalidArgument) + ": " + tc.Text + "; check the arguments against the tool's input schema"
		}
		return res, err
	}
}
