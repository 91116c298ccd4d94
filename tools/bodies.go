package tools

import (
	"context"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// Memory is the server's budget for what is in flight: the calls of every
// session and, over HTTP, the request bodies arriving (see
// cmd/sandbox-mcp/internal/httpguard, which cmd/sandbox-mcp wires to ReserveBody). Give it
// to Deps.Memory so the tools and the transport share one budget.
type Memory struct{ b *budget }

// NewMemory returns a budget of p.MaxInflightBytes in all, and
// p.MaxSessionInflightBytes per session.
func NewMemory(p policy.Policy) *Memory {
	return &Memory{b: newBudget(p.MaxInflightBytes, p.MaxSessionInflightBytes)}
}

// BodyHold is the part of the budget a request body holds.
type BodyHold struct{ r *reservation }

// ReserveBody takes n bytes for a request body of caller, waiting up to
// wait for others to give bytes back. A caller's bodies count against its
// fair share and the total like its calls, and all of them together
// against one session's share (--max-session-inflight-bytes): however many
// bodies a caller sends at once, they hold no more than one session may.
// A refusal is an error whose ServerWide method says whether the total
// was short (or the caller's own share).
func (m *Memory) ReserveBody(ctx context.Context, caller string, n int64, wait time.Duration) (*BodyHold, error) {
	r, err := m.b.reserveFor(ctx, key{caller: caller, session: "http-bodies " + caller}, n, wait)
	if err != nil {
		return nil, err
	}
	return &BodyHold{r}, nil
}

// Resize makes the hold n bytes, taking more only if it fits now.
func (h *BodyHold) Resize(n int64) error { return h.r.resize(n) }

// Release gives the hold back; later calls do nothing.
func (h *BodyHold) Release() { h.r.release() }
