package tools

import (
	"context"
	"reflect"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// structuredSince is the first protocol version with structured content:
// a client that negotiated an older one reads only a result's text.
const structuredSince = "2025-06-18"

// sessionlessSince is the first protocol version without protocol
// sessions (SEP-2567): each request carries its version, client info and
// capabilities in its _meta, and over HTTP each is served on a session of
// its own that ends with it.
const sessionlessSince = "2026-07-28"

// sessionless reports whether a request follows MCP 2026-07-28 or later:
// its _meta names the version (the SDK checks it against the
// MCP-Protocol-Version header on HTTP and against the versions served).
func sessionless(req mcp.Request) bool {
	v, _ := metaVersion(req)
	return v >= sessionlessSince
}

// metaVersion returns the protocol version a request's _meta names, if any.
func metaVersion(req mcp.Request) (string, bool) {
	if req == nil {
		return "", false
	}
	p := req.GetParams()
	if p == nil {
		return "", false
	}
	if rv := reflect.ValueOf(p); rv.Kind() == reflect.Pointer && rv.IsNil() {
		return "", false
	}
	v, ok := p.GetMeta()[mcp.MetaKeyProtocolVersion].(string)
	return v, ok && v != ""
}

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
// On 2026-07-28 and later the version is the request's own (its _meta,
// which the SDK also puts in the request's session InitializeParams);
// before, the one the session's initialize negotiated.
func (d *Deps) textOnly(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil {
		return false
	}
	if v, ok := metaVersion(req); ok && v >= sessionlessSince {
		return req.ProtocolVersion() < structuredSince
	}
	if d.versions == nil {
		return false
	}
	v := d.versions.of(req.Session)
	return v != "" && v < structuredSince
}

// noSchemasBefore is a receiving middleware that lists no output schemas
// to a client that negotiated a version from before structured content:
// its results carry none (textOnly), and a client that validates results
// against the listed schema (the TypeScript SDK's does) would refuse
// every one of them.
func (v *versions) noSchemasBefore(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		lr, ok := res.(*mcp.ListToolsResult)
		if err != nil || !ok || method != "tools/list" {
			return res, err
		}
		if mv, has := metaVersion(req); has && mv >= sessionlessSince {
			return res, err
		}
		ss, isServer := req.GetSession().(*mcp.ServerSession)
		if !isServer {
			return res, err
		}
		if nv := v.of(ss); nv == "" || nv >= structuredSince {
			return res, err
		}
		out := *lr
		out.Tools = make([]*mcp.Tool, len(lr.Tools))
		for i, t := range lr.Tools {
			c := *t // the server's own tools are shared: change a copy
			c.OutputSchema = nil
			out.Tools[i] = &c
		}
		return &out, err
	}
}
