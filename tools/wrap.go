package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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
	// Previews serves sandbox_expose's URLs; nil means previews are off,
	// and PreviewsOff says why (the tool's error names it).
	Previews    Previews
	PreviewsOff string
	// AuditApproval, if set, receives every question put to a person
	// about a refused host, and its answer (see approval.go).
	AuditApproval func(ApprovalRecord)

	// progressBeat, if set, replaces defaultProgressBeat (tests).
	progressBeat time.Duration

	// Memory, if set, is the budget the tools share with the HTTP
	// transport; All makes one of Policy's sizes otherwise.
	Memory *Memory

	// budget bounds the memory of calls in flight, from Policy's
	// MaxInflightBytes and MaxSessionInflightBytes; All makes it.
	budget *budget
	// versions are the protocol versions sessions negotiated; All makes
	// it.
	versions *versions
	// approvableHosts are Policy.NetworkApproval parsed (nil: off), and
	// approvals what was asked per sandbox; All makes them.
	approvableHosts *session.HostPatterns
	approvals       *approvals // shared by the copies forCall makes; set by All
}

// Record describes one tool call, for the log and the audit log. It has no
// wire form of its own: the audit log's line is audit's, which main fills
// from this.
type Record struct {
	Time      time.Time
	Caller    string
	Session   string
	Sandbox   string
	Tool      string
	ArgDigest string
	// Args are the call's arguments as received; the audit log records
	// only their keyed digest.
	Args     json.RawMessage
	Decision string // allow or deny
	Reason   string
	ExitCode *int
	Bytes    int64
	Duration float64 // milliseconds
}

// call is the state of one tool call, filled in by its handler and logged
// by the wrapper.
type call struct {
	req     *mcp.CallToolRequest
	sandbox string
	// named is the sandbox the call names, once looked up (Deps.forCall):
	// looked says it was, namedErr why it was not found.
	named    Sandbox
	namedErr error
	looked   bool
	bytes    int64
	exit     *int
	// held is the part of the memory budget the call holds (see
	// Deps.reserve); the wrapper gives it back once the result is sent.
	held *reservation
	// notice is what the result must tell first about the sandbox
	// (Sandbox.TakeNotice).
	notice string
	// waited is how long the call waited for sandboxes to be prepared
	// (see Deps.prepared), out of its budget; progressed is the progress
	// value its last notification carried, which the next must exceed.
	waited     time.Duration
	progressed float64
}

// CodeRequestCancelled is the JSON-RPC error code of the answer to a
// cancelled call, where the transport cannot leave it unanswered. MCP
// defines none; this is the code LSP uses for the same case.
const CodeRequestCancelled = -32800

// A tool is two functions, which the wrapper (wrap) calls in this order,
// after the SDK has decoded the arguments and checked them against the
// input schema:
//
//  1. check asks policy about the input alone and returns what run needs
//     (a path made relative to the workspace, a timeout, a mode...). It
//     touches no sandbox: a refused call makes none.
//  2. The wrapper resolves the sandbox the call runs in: the session's own,
//     or the one named in its sandbox argument (In.target). A tool that
//     works in no sandbox (deleting or listing snapshots) says so with its
//     input's inNoSandbox method: none is resolved, none is made, and run
//     gets nil.
//  3. run reserves the memory the call holds, asks policy what only the
//     sandbox can tell (which program an allowlisted name resolves to),
//     calls the sandbox and renders: it returns the output and, when
//     the model should read something else than the output's JSON, a
//     result carrying that text (and isError, for a command that timed
//     out; CallToolResult.SetError keeps its *errcode.Error, so codeErrors
//     knows the result as the tool's).
//
// A failure the model can act on is an *errcode.Error, from either.
type (
	checkFunc[In, Req any] func(d *Deps, in In) (Req, error)
	runFunc[Req, Out any]  func(d *Deps, ctx context.Context, c *call, sb Sandbox, req Req) (*mcp.CallToolResult, Out, error)
	input                  interface{ target() string }
)

// Both get the Deps whose Policy is the one the call is checked against:
// the server's, or the template's of the sandbox the call names (see
// Deps.forCall).

// as is the check of a tool that asks policy nothing: run gets the input.
func as[In any](_ *Deps, in In) (In, error) { return in, nil }

// static is the check f, which asks policy nothing.
func static[In, Req any](f func(In) (Req, error)) checkFunc[In, Req] {
	return func(_ *Deps, in In) (Req, error) { return f(in) }
}

// templated is a sandbox made from an operator's template
// (*session.Sandbox): the calls on it are checked against its template's
// policy.
type templated interface {
	Template() string
	Policy() policy.Policy
}

// forCall returns the Deps a call naming sandbox target is checked and run
// with: d itself, unless target is one of owner's sandboxes made from
// another template than the default, whose policy then applies (its
// read-only workspace, exec allowlist, limits). The sandbox is only looked
// up, never started or made: a call refused by its policy touches nothing.
// A target not found is left to the sandbox's resolution, which says so.
func (d *Deps) forCall(c *call, target string) *Deps {
	if target == "" || d.Sessions == nil || d.Sessions.m == nil {
		return d
	}
	sb, err := d.Sessions.m.Lookup(target, d.Sessions.Owner(c.req))
	c.looked = true // looked up once: the call then runs in it, or is NOT_FOUND
	if err != nil {
		c.namedErr = err
		return d
	}
	c.named = sb
	ts, ok := sb.(templated)
	if !ok || ts.Template() == session.DefaultTemplate {
		return d
	}
	td := *d
	td.Policy = ts.Policy()
	// The hosts a person may approve are the template's own
	// (its "network-approval"; none without its egress proxy).
	td.approvableHosts = nil
	if td.Policy.Network == policy.NetworkAllowlist {
		td.approvableHosts = parseApprovable(td.Policy.NetworkApproval)
	}
	return &td
}

// changeablePath is the check of a tool that changes or removes what is at
// path: the workspace is writable, and path, made relative to it, is not
// the workspace root.
func (d *Deps) changeablePath(path string) (string, error) {
	if dec := d.Policy.CanWrite(); !dec.Allow {
		return "", dec.Err()
	}
	rel, dec := policy.WorkspacePath(path)
	if !dec.Allow {
		return "", dec.Err()
	}
	if dec := policy.CheckRenamable(rel); !dec.Allow {
		return "", dec.Err()
	}
	return rel, nil
}

// wrap turns a tool's check and run into an SDK handler that calls them in
// order (see checkFunc), logs one record per call, feeds the audit log, and
// sorts errors into tool errors and protocol errors.
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
func wrap[In input, Req, Out any](d *Deps, name string, check checkFunc[In, Req], run runFunc[Req, Out]) mcp.ToolHandlerFor[In, any] {
	handle := func(ctx context.Context, c *call, in In) (*mcp.CallToolResult, Out, error) {
		var none Out
		ns, isNS := any(in).(interface{ inNoSandbox() bool })
		noSandbox := isNS && ns.inNoSandbox()
		pd := d
		if !noSandbox {
			pd = d.forCall(c, in.target())
		}
		req, err := check(pd, in)
		if err != nil {
			return nil, none, err
		}
		var sb Sandbox
		if !noSandbox {
			if err := d.prepared(ctx, c); err != nil {
				return nil, none, err
			}
			if sb, err = d.Sessions.sandbox(c, in.target()); err != nil {
				return nil, none, err
			}
		}
		if sb != nil {
			// A call that carries the person's answers to its
			// questions (2026-07-28) is settled with them, whichever
			// tool asked.
			if res, out, err, resumed := resumeApproval[Out](pd, c, sb); resumed {
				return res, out, err
			}
		}
		res, out, err := run(pd, ctx, c, sb, req)
		if err == nil && sb != nil {
			c.notice = sb.TakeNotice()
		}
		return res, out, err
	}
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		start := time.Now()
		c := &call{req: req}
		res, out, err := handle(ctx, c, in)
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
		if res.InputRequests != nil {
			return res, nil, nil // questions for the person (2026-07-28): no content
		}
		if _, none := any(out).(noOutput); none {
			noticeFirst(res, c.notice)
			return res, nil, nil // a tool without an output schema
		}
		if !d.textOnly(req) {
			// A client that negotiated a version without structured
			// content reads the text alone: the copy would be bytes sent
			// for nothing.
			res.StructuredContent = out
		}
		if res.Content == nil {
			// As the SDK does for a typed output: the JSON as text too.
			b, err := json.Marshal(out)
			if err != nil {
				return nil, nil, fmt.Errorf("tools: %s: marshal output: %w", name, err)
			}
			res.Content = []mcp.Content{&mcp.TextContent{Text: string(b)}}
		}
		noticeFirst(res, c.notice)
		return res, nil, nil
	}
}

// preparer is a registry of sandboxes whose sandboxes need something
// prepared first (session.Manager.WaitPrepared); one that needs nothing (a
// test's) need not implement it.
type preparer interface {
	WaitPrepared(ctx context.Context, maxWait, every time.Duration, beat func(string)) error
}

// prepareBeat is the longest a call that waits for the preparation of
// sandboxes, and holds a progress token, goes without a notification.
const prepareBeat = 5 * time.Second

// prepared waits, before a call makes or finds its sandbox, until what
// sandboxes need is prepared: a moment, except in the first minutes after
// the server started with an agent or a --workspace-from the engine has
// not seen. The wait is bounded by the call's budget (--max-call-wait);
// with a progress token, the client hears what is being prepared at once
// and every prepareBeat.
func (d *Deps) prepared(ctx context.Context, c *call) error {
	p, ok := d.Sessions.m.(preparer)
	if !ok {
		return nil
	}
	start := time.Now()
	defer func() { c.waited = time.Since(start) }()
	var beat func(string)
	if tok := c.req.Params.GetProgressToken(); tok != nil {
		beat = func(msg string) {
			c.progressed++
			_ = c.req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: c.progressed, Message: "sandbox-mcp: " + msg})
		}
	}
	every := prepareBeat
	if d.progressBeat > 0 {
		every = min(every, d.progressBeat)
	}
	return p.WaitPrepared(ctx, d.Policy.MaxCallWait, every, beat)
}

// sessionID names the MCP session for logs: its id over HTTP, "stdio"
// over stdio, and none for an HTTP request of MCP 2026-07-28, which is
// served on a session of its own without an id.
func sessionID(req *mcp.CallToolRequest) string {
	if req.Session == nil {
		return ""
	}
	if id := req.Session.ID(); id != "" {
		return id
	}
	if req.Extra != nil && req.Extra.Header != nil {
		return ""
	}
	return "stdio"
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
			if renamed := renamedArgument(req); renamed != "" {
				tc.Text = renamed
			} else {
				tc.Text = string(errcode.InvalidArgument) + ": " + tc.Text + "; check the arguments against the tool's input schema"
			}
		}
		return res, err
	}
}

// noticeFirst puts what the model must know about the sandbox before the
// result's text.
func noticeFirst(res *mcp.CallToolResult, notice string) {
	if notice == "" {
		return
	}
	notice = "NOTE: " + notice
	if len(res.Content) > 0 {
		if tc, ok := res.Content[0].(*mcp.TextContent); ok {
			tc.Text = notice + "\n\n" + tc.Text
			return
		}
	}
	res.Content = append([]mcp.Content{&mcp.TextContent{Text: notice}}, res.Content...)
}

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}
