package tools

import (
	"context"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// structuredSince is the first protocol version with structured content:
// a client that negotiated an older one reads only a result's text.
const structuredSince = "2025-06-18"

// versions are the protocol versions the server's sessions negotiated: the
// version the server answered initialize with, which is the one the client
// asked for only when the server serves it. The SDK keeps it, but does not
// show it.
type versions struct {
	mu sync.Mutex
	m  map[*mcp.ServerSession]string
}

func newVersions() *versions { return &versions{m: make(map[*mcp.ServerSession]string)} }

// record is a receiving middleware that notes the version each session's
// initialize negotiated, until the session ends.
func (v *versions) record(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		ir, ok := res.(*mcp.InitializeResult)
		ss, isServer := req.GetSession().(*mcp.ServerSession)
		if err != nil || !ok || !isServer || ir.ProtocolVersion == "" {
			return res, err
		}
		v.mu.Lock()
		_, seen := v.m[ss]
		v.m[ss] = ir.ProtocolVersion
		v.mu.Unlock()
		if !seen {
			go func() {
				_ = ss.Wait()
				v.mu.Lock()
				delete(v.m, ss)
				v.mu.Unlock()
			}()
		}
		return res, err
	}
}

// of returns the version ss negotiated; "" when it has not.
func (v *versions) of(ss *mcp.ServerSession) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.m[ss]
}

// textOnly reports whether the client of a call negotiated a protocol
// version from before structured content, so that it reads only a
// result's text content: the result carries no structured copy for it.
func (d *Deps) textOnly(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil || d.versions == nil {
		return false
	}
	v := d.versions.of(req.Session)
	return v != "" && v < structuredSince
}
