package main

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// unansweredCancels is a transport whose connection sends no response to a
// request the client cancelled with notifications/cancelled, as the MCP
// specification asks: the go-sdk cancels the handler's context but still
// writes whatever the handler returns. The tools answer a cancelled call
// with a JSON-RPC error, never a tool result; over stdio this drops it.
//
// Only requests in flight are tracked, so a cancellation that arrives after
// the response went out marks nothing, and the set is bounded by the calls
// in flight. Limitation: the go-sdk no longer learns the negotiated
// protocol version on this connection, which it uses only to refuse JSON-RPC
// batches from clients of 2025-06-18 and later; within a batch (clients of
// 2025-03-26 and before), a cancelled call would hold back the batch's
// reply, so cancel calls sent alone.
type unansweredCancels struct{ mcp.Transport }

func (t unansweredCancels) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &cancelConn{Connection: c, inflight: map[jsonrpc.ID]bool{}}, nil
}

type cancelConn struct {
	mcp.Connection

	mu sync.Mutex
	// inflight holds the ids of the client's requests not answered yet,
	// true once cancelled.
	inflight map[jsonrpc.ID]bool
}

func (c *cancelConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && err == nil {
		switch {
		case req.IsCall():
			c.mu.Lock()
			c.inflight[req.ID] = false
			c.mu.Unlock()
		case req.Method == "notifications/cancelled":
			var p mcp.CancelledParams
			if json.Unmarshal(req.Params, &p) == nil {
				if id, err := jsonrpc.MakeID(p.RequestID); err == nil {
					c.mu.Lock()
					if _, ok := c.inflight[id]; ok {
						c.inflight[id] = true
					}
					c.mu.Unlock()
				}
			}
		}
	}
	return msg, err
}

func (c *cancelConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		cancelled := c.inflight[resp.ID]
		delete(c.inflight, resp.ID)
		c.mu.Unlock()
		if cancelled {
			return nil
		}
	}
	return c.Connection.Write(ctx, msg)
}
