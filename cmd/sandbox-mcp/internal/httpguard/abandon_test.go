package httpguard

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestPostsEndCallsOfADroppedPost: a call carried by a POST whose context
// ends is cancelled with errAbandoned; a tag a client sends itself is
// replaced, so no client can name another's POST.
func TestPostsEndCallsOfADroppedPost(t *testing.T) {
	p := newPosts()
	ctx, drop := context.WithCancel(context.Background())
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil).WithContext(ctx)
	r.Header.Set(postHeader, "forged")
	r, served := p.tag(r)
	if tag := r.Header.Get(postHeader); tag == "" || tag == "forged" {
		t.Fatalf("tag %q", tag)
	}
	started, ended := make(chan struct{}), make(chan error, 1)
	h := p.watch(func(ctx context.Context, _ string, _ mcp.Request) (mcp.Result, error) {
		close(started)
		<-ctx.Done()
		ended <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	req := &mcp.CallToolRequest{Extra: &mcp.RequestExtra{Header: r.Header}}
	go h(context.Background(), "tools/call", req)
	<-started
	drop()
	if err := <-ended; !errors.Is(err, errAbandoned) {
		t.Fatalf("the call ended with %v, want errAbandoned", err)
	}
	served()

	// A GET carries no tag, and a call without one runs untouched.
	g := httptest.NewRequest(http.MethodGet, "/mcp", nil)
	g.Header.Set(postHeader, "forged")
	g, _ = p.tag(g)
	if g.Header.Get(postHeader) != "" {
		t.Fatal("a client's tag was kept")
	}
	res, err := p.watch(func(ctx context.Context, _ string, _ mcp.Request) (mcp.Result, error) {
		return &mcp.CallToolResult{}, ctx.Err()
	})(context.Background(), "tools/call", &mcp.CallToolRequest{Extra: &mcp.RequestExtra{Header: g.Header}})
	if err != nil || res == nil {
		t.Fatalf("untagged call: %v %v", res, err)
	}
}
