package main

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

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// sessionQuota admits requests that may open an MCP session, under
// --max-sessions and --max-sessions-per-caller.
//
// It counts sessions where the SDK makes them, not by reading request
// bodies: the SDK's own list of live sessions (mcp.Server.Sessions), which
// every session enters when Server.Connect makes it and leaves when it is
// closed, plus the admitted requests still in the SDK, any of which may be
// making one. A body the SDK reads differently from a guard (keys in
// another case, duplicate keys, batches) cannot open a session past the
// caps, since no body is read here. The SDK makes a session only for a POST
// without an Mcp-Session-Id header, so each such request is admitted first.
//
// A session's caller is the one its first message came from (the SDK
// refuses requests of another caller on a session), noted by noteOwner.
type sessionQuota struct {
	server    *mcp.Server
	max       int // --max-sessions
	perCaller int // --max-sessions-per-caller

	mu sync.Mutex
	// opening counts, per caller, the admitted requests still in the SDK;
	// their sessions may or may not be in the server's list yet, so a
	// session being made counts twice until its request returns.
	opening      map[string]int
	openingTotal int
	// owners names the caller of each session that has handled a message.
	// Entries of closed sessions are dropped at the next admission.
	owners map[*mcp.ServerSession]string
}

func newSessionQuota(server *mcp.Server, max, perCaller int) *sessionQuota {
	return &sessionQuota{
		server: server, max: max, perCaller: perCaller,
		opening: make(map[string]int), owners: make(map[*mcp.ServerSession]string),
	}
}

// quotaRefusal is why a request was refused: the HTTP status and what the
// caller can do.
type quotaRefusal struct {
	status int
	msg    string
}

// admit lets a request that may open a session for caller into the SDK,
// or says why not. done must be called once the SDK has served it.
func (q *sessionQuota) admit(caller string) (done func(), refused *quotaRefusal) {
	q.mu.Lock()
	defer q.mu.Unlock()
	total, mine := q.openingTotal, q.opening[caller]
	live := make(map[*mcp.ServerSession]bool)
	for ss := range q.server.Sessions() {
		live[ss] = true
		total++
		if o, ok := q.owners[ss]; ok && o == caller {
			mine++
		}
	}
	for ss := range q.owners {
		if !live[ss] {
			delete(q.owners, ss)
		}
	}
	switch {
	case total >= q.max:
		return nil, &quotaRefusal{http.StatusServiceUnavailable, fmt.Sprintf(
			"this server already serves %d sessions, its limit (--max-sessions)", q.max)}
	case mine >= q.perCaller:
		return nil, &quotaRefusal{http.StatusTooManyRequests, fmt.Sprintf(
			"you already have %d sessions open, the most one caller may hold (--max-sessions-per-caller)", q.perCaller)}
	}
	q.opening[caller]++
	q.openingTotal++
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.opening[caller]--; q.opening[caller] == 0 {
			delete(q.opening, caller)
		}
		q.openingTotal--
	}, nil
}

// noteOwner is server middleware that notes the caller of each session
// the first time it handles a message.
func (q *sessionQuota) noteOwner(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil {
			caller := ownerOf(req.GetExtra())
			q.mu.Lock()
			if _, seen := q.owners[ss]; !seen {
				q.owners[ss] = caller
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
		caller := ownerOf(req.GetExtra())
		if !q.take(caller) {
			q.log.Info("call refused", "caller", caller, "method", method, "reason", "--max-calls-per-caller", "max", q.max)
			msg := fmt.Sprintf("%s: you already have %d calls in flight, the most one caller may run at once (--max-calls-per-caller); wait for one to finish, then retry",
				policy.Busy, q.max)
			if method == "tools/call" {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}, nil
			}
			return nil, &jsonrpc.Error{Code: busyRPCCode, Message: msg}
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
