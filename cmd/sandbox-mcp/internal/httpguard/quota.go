package httpguard

// Quotas of the HTTP transport: how many MCP sessions live at once, in all
// and per caller, and how many calls one caller has in flight.

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// sessionQuota admits requests that may open an MCP session, under
// --max-sandboxes and --max-sandboxes-per-caller. Package session counts
// the sandboxes themselves, where they are made; this caps the sessions,
// which hold server memory (the SDK's state, an event stream) whether or
// not they made a sandbox: each can make at most one of its own, so the
// same numbers bound them.
//
// It counts sessions where the SDK makes them, not by reading request
// bodies. The SDK makes a session only from a POST without an
// Mcp-Session-Id header, so every such request takes an admission before
// the SDK sees it, whatever its body holds. The SDK runs the session made
// from a request with that request's context, so the admission rides along
// and noteSession ties it to the session at its first message. An admission
// is held while its request is served, and after that for as long as its
// session is in the SDK's own list of live sessions (mcp.Server.Sessions),
// which a session leaves when it is closed. The count is the larger of the
// admissions held and that list, so a session that somehow escaped its
// admission would still count.
type sessionQuota struct {
	server    *mcp.Server
	max       int // --max-sandboxes
	perCaller int // --max-sandboxes-per-caller

	mu   sync.Mutex
	held map[*admission]bool // in force; pruned at each admission
}

// admission is the place a request that may open a session takes.
type admission struct {
	caller  string
	served  bool               // its request has returned
	session *mcp.ServerSession // the session it made, once that handled a message
}

// admissionKey is the context key of a request's admission.
type admissionKey struct{}

func newSessionQuota(server *mcp.Server, max, perCaller int) *sessionQuota {
	return &sessionQuota{server: server, max: max, perCaller: perCaller, held: make(map[*admission]bool)}
}

// quotaRefusal is why a request was refused: the HTTP status and what the
// caller can do.
type quotaRefusal struct {
	status int
	msg    string
}

// admit lets a request of caller that may open a session into the SDK: it
// returns the request to serve, carrying its admission, and done, to call
// once the SDK has served it. Or it says why not.
func (q *sessionQuota) admit(r *http.Request, caller string) (_ *http.Request, done func(), refused *quotaRefusal) {
	q.mu.Lock()
	defer q.mu.Unlock()
	live := make(map[*mcp.ServerSession]bool)
	for ss := range q.server.Sessions() {
		// A session without an id is a stateless request's (MCP
		// 2026-07-28), which ends with its request and holds nothing.
		if ss.ID() != "" {
			live[ss] = true
		}
	}
	mine := 0
	for a := range q.held {
		if a.served && (a.session == nil || !live[a.session]) {
			delete(q.held, a)
		} else if a.caller == caller {
			mine++
		}
	}
	switch {
	case max(len(q.held), len(live)) >= q.max:
		return nil, nil, &quotaRefusal{http.StatusServiceUnavailable, fmt.Sprintf(
			"this server already serves %d sessions, its limit (--max-sandboxes, which caps sessions too)", q.max)}
	case mine >= q.perCaller:
		return nil, nil, &quotaRefusal{http.StatusTooManyRequests, fmt.Sprintf(
			"you already have %d sessions open, the most one caller may hold (--max-sandboxes-per-caller, which caps sessions too)", q.perCaller)}
	}
	a := &admission{caller: caller}
	q.held[a] = true
	return r.WithContext(context.WithValue(r.Context(), admissionKey{}, a)), func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		a.served = true
		if a.session == nil {
			delete(q.held, a)
		}
	}, nil
}

// noteSession is server middleware that ties an admission to the session
// made from its request, at the session's first message.
func (q *sessionQuota) noteSession(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		a, ok := ctx.Value(admissionKey{}).(*admission)
		ss, isServer := req.GetSession().(*mcp.ServerSession)
		if ok && isServer && ss != nil {
			q.mu.Lock()
			if a.session == nil {
				a.session = ss
				q.held[a] = true // held again should its request be over
			}
			q.mu.Unlock()
		}
		return next(ctx, method, req)
	}
}

// callQuota caps the calls one caller has in flight (--max-calls-per-caller):
// tool calls and resource reads, the requests that cost a sandbox's or the
// server's work. Past the cap a tool call gets a BUSY tool error, and a
// resource read a JSON-RPC error, at once.
type callQuota struct {
	max int
	log *slog.Logger

	mu       sync.Mutex
	inFlight map[string]int // caller → calls in flight
}

func newCallQuota(max int, log *slog.Logger) *callQuota {
	return &callQuota{max: max, log: log, inFlight: make(map[string]int)}
}

// limit is server middleware that enforces the cap.
func (q *callQuota) limit(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" && method != "resources/read" {
			return next(ctx, method, req)
		}
		caller := OwnerOf(req.GetExtra())
		if !q.take(caller) {
			q.log.Info("call refused", "caller", caller, "method", method, "reason", "--max-calls-per-caller", "max", q.max)
			busy := errcode.Errorf(errcode.Busy, "you already have %d calls in flight, the most one caller may run at once (--max-calls-per-caller); wait for one to finish, then retry", q.max)
			if method == "tools/call" {
				res := &mcp.CallToolResult{}
				res.SetError(busy) // a tool error: the text is "BUSY: ..."
				return res, nil
			}
			return nil, &jsonrpc.Error{Code: busyRPCCode, Message: busy.Error()}
		}
		defer q.give(caller)
		return next(ctx, method, req)
	}
}

// busyRPCCode is the JSON-RPC error code of a request refused for a quota
// (in the range JSON-RPC leaves to servers).
const busyRPCCode = -32000

func (q *callQuota) take(caller string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inFlight[caller] >= q.max {
		return false
	}
	q.inFlight[caller]++
	return true
}

func (q *callQuota) give(caller string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inFlight[caller]--; q.inFlight[caller] == 0 {
		delete(q.inFlight, caller)
	}
}
