package httpguard

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A tool call or resource read over HTTP is answered on the response of the
// POST that carried it. The server keeps no event store, so once that
// response's connection is gone the answer can never reach the client; and
// a client such as mcp-go's sends no notifications/cancelled over HTTP when
// it gives up. Without more, the command would run to its timeout and hold
// a --max-execs slot. So each POST is tagged, on the way in, with a private
// header naming its context (the go-sdk hands a request's headers to the
// method handlers), and middleware cancels the calls of a POST whose
// context ends: net/http ends it when the client closes the connection.

// postHeader carries the tag. The guard removes any value a client sends.
const postHeader = "X-Sandbox-Mcp-Post"

// abandonedKeep is how long the tag of a POST whose client went away while
// it was served stays known, for its calls not yet started: they are
// cancelled at once.
const abandonedKeep = time.Minute

// errAbandoned is why the calls of a dropped POST end.
var errAbandoned = errors.New("the client closed the HTTP request that carried the call")

// posts maps the tags of POSTs being served to their contexts.
type posts struct {
	mu sync.Mutex
	m  map[string]context.Context
}

func newPosts() *posts { return &posts{m: make(map[string]context.Context)} }

// tag marks r with a fresh tag and returns the request to serve and the
// function to call once it is served.
func (p *posts) tag(r *http.Request) (*http.Request, func()) {
	r.Header.Del(postHeader)
	if r.Method != http.MethodPost {
		return r, func() {}
	}
	t := rand.Text()
	ctx := r.Context()
	p.mu.Lock()
	p.m[t] = ctx
	p.mu.Unlock()
	r.Header.Set(postHeader, t)
	return r, func() {
		forget := func() {
			p.mu.Lock()
			delete(p.m, t)
			p.mu.Unlock()
		}
		if ctx.Err() == nil {
			forget() // answered: its calls are done
			return
		}
		time.AfterFunc(abandonedKeep, forget)
	}
}

// watch is server middleware that ends a call when the POST that carried
// it is gone.
func (p *posts) watch(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		extra := req.GetExtra()
		if extra == nil || extra.Header == nil {
			return next(ctx, method, req)
		}
		p.mu.Lock()
		post, ok := p.m[extra.Header.Get(postHeader)]
		p.mu.Unlock()
		if !ok {
			return next(ctx, method, req)
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(post, func() { cancel(errAbandoned) })
		defer stop()
		return next(ctx, method, req)
	}
}
