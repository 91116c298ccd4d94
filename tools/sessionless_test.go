package tools

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// keyedSandboxes is a registry that records the keys it is asked for and
// released, and answers with one fake sandbox.
type keyedSandboxes struct {
	fakeSandboxes
	mu       sync.Mutex
	keys     []string
	released []string
}

func (k *keyedSandboxes) Sandbox(key, owner string) (Sandbox, error) {
	k.mu.Lock()
	k.keys = append(k.keys, key+"@"+owner)
	k.mu.Unlock()
	return k.sb, nil
}

func (k *keyedSandboxes) Release(key string) {
	k.mu.Lock()
	k.released = append(k.released, key)
	k.mu.Unlock()
}

func (k *keyedSandboxes) seen() (keys, released []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.keys), slices.Clone(k.released)
}

func newKeyed(t *testing.T) *keyedSandboxes {
	snaps, err := snapshot.OpenStore(t.TempDir(), snapshot.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	k := &keyedSandboxes{}
	k.snaps = snaps
	k.sb = &fakeSandbox{f: &k.fakeSandboxes}
	return k
}

// serveAt serves d to one go-sdk client over the in-memory transports, at
// version ("" for the client's own preference, 2026-07-28), and returns
// the client and a function that ends the connection and waits for the
// server's side to end.
func serveAt(t *testing.T, d *Deps, version string) (*mcp.ClientSession, func()) {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	Register(s, d)
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "0"}, nil).Connect(ctx, ct, opts)
	if err != nil {
		ss.Close()
		t.Fatal(err)
	}
	var once sync.Once
	end := func() { once.Do(func() { cs.Close(); ss.Wait() }) }
	t.Cleanup(end)
	return cs, end
}

func callList(t *testing.T, cs *mcp.ClientSession, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: NameList, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// eventually waits for the registry's releases to satisfy ok.
func eventually(t *testing.T, k *keyedSandboxes, ok func(released []string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, rel := k.seen()
		if ok(rel) || time.Now().After(deadline) {
			return rel
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSessionlessImplicitSandbox: which sandbox a call without `sandbox`
// uses, by protocol revision and rule. On 2026-07-28 with the connection's
// rule (stdio) every call of the connection gets the key of its one MCP
// session, released only when the connection ends; with no implicit
// sandbox (HTTP) the call is refused with INVALID_ARGUMENT and makes
// nothing, while a 2025-11-25 client on the same server keeps its
// session's; with a sandbox per caller two connections of one caller get
// the caller's key and their end releases nothing.
func TestSessionlessImplicitSandbox(t *testing.T) {
	deps := func(k *keyedSandboxes, rule Sessionless, owner string) *Deps {
		s := SessionsOver(k)
		s.Sessionless = rule
		s.OwnerOf = func(*mcp.RequestExtra) string { return owner }
		return &Deps{Policy: policy.Default(), Sessions: s, Logger: slog.New(slog.DiscardHandler)}
	}

	t.Run("connection", func(t *testing.T) {
		k := newKeyed(t)
		cs, end := serveAt(t, deps(k, SessionlessConnection, ""), "")
		if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
			t.Fatalf("negotiated %q, want 2026-07-28", v)
		}
		for range 3 {
			if res := callList(t, cs, nil); res.IsError {
				t.Fatalf("call failed: %v", res.Content)
			}
		}
		keys, rel := k.seen()
		if len(keys) != 3 || keys[0] != keys[1] || keys[1] != keys[2] || !strings.HasPrefix(keys[0], "mcp-") {
			t.Fatalf("the calls of one connection got keys %v, want one session key thrice", keys)
		}
		if len(rel) != 0 {
			t.Fatalf("released %v while the connection lives", rel)
		}
		end()
		key, _, _ := strings.Cut(keys[0], "@")
		if rel := eventually(t, k, func(r []string) bool { return len(r) > 0 }); !slices.Equal(rel, []string{key}) {
			t.Fatalf("at the connection's end released %v, want [%s]", rel, key)
		}
	})

	t.Run("none", func(t *testing.T) {
		k := newKeyed(t)
		d := deps(k, SessionlessNone, "alice")
		cs, _ := serveAt(t, d, "")
		res := callList(t, cs, nil)
		if !res.IsError || !strings.HasPrefix(text(res), "INVALID_ARGUMENT: ") || !strings.Contains(text(res), "sandbox_create") {
			t.Fatalf("a 2026-07-28 call without sandbox got %v, want INVALID_ARGUMENT naming sandbox_create", res.Content)
		}
		// Naming a sandbox works; a wrong one says what to do instead.
		if res := callList(t, cs, map[string]any{"sandbox": "sb-fake"}); res.IsError {
			t.Fatalf("naming the sandbox: %v", res.Content)
		}
		if res := callList(t, cs, map[string]any{"sandbox": "sb-other"}); !strings.HasPrefix(text(res), "NOT_FOUND: ") || !strings.Contains(text(res), "sandbox_create") {
			t.Fatalf("naming another sandbox: %v", res.Content)
		}
		if keys, _ := k.seen(); len(keys) != 0 {
			t.Fatalf("2026-07-28 calls made implicit sandboxes %v", keys)
		}
		old, end := serveAt(t, d, "2025-11-25")
		if res := callList(t, old, nil); res.IsError {
			t.Fatalf("a 2025-11-25 call without sandbox: %v", res.Content)
		}
		keys, _ := k.seen()
		if len(keys) != 1 || !strings.HasPrefix(keys[0], "mcp-") || keys[0][len(keys[0])-len("@alice"):] != "@alice" {
			t.Fatalf("the 2025-11-25 session got %v, want its session's key", keys)
		}
		end()
		if rel := eventually(t, k, func(r []string) bool { return len(r) > 0 }); len(rel) != 1 {
			t.Fatalf("the 2025-11-25 session's end released %v", rel)
		}
	})

	t.Run("per-caller", func(t *testing.T) {
		k := newKeyed(t)
		d := deps(k, SessionlessPerCaller, "alice")
		a, endA := serveAt(t, d, "")
		b, endB := serveAt(t, d, "")
		for _, cs := range []*mcp.ClientSession{a, b, a} {
			if res := callList(t, cs, nil); res.IsError {
				t.Fatalf("call failed: %v", res.Content)
			}
		}
		endA()
		endB()
		time.Sleep(100 * time.Millisecond) // a release would follow the session's end
		keys, rel := k.seen()
		if !slices.Equal(keys, []string{"default-alice@alice", "default-alice@alice", "default-alice@alice"}) {
			t.Fatalf("keys %v, want the caller's default thrice", keys)
		}
		if len(rel) != 0 {
			t.Fatalf("the end of a session released %v", rel)
		}
	})
}

// TestSessionlessResults: a 2026-07-28 client gets structured results, and
// resources/list is the same whatever calls came before, where a
// 2025-11-25 client's lists its snapshots.
func TestSessionlessResults(t *testing.T) {
	k := newKeyed(t)
	s := SessionsOver(k)
	d := &Deps{Policy: policy.Default(), Sessions: s, Logger: slog.New(slog.DiscardHandler)}
	cs, _ := serveAt(t, d, "")
	res := callList(t, cs, nil)
	if res.IsError || res.StructuredContent == nil {
		t.Fatalf("a 2026-07-28 call got no structured content: %v", res.Content)
	}
	ctx := context.Background()
	list := func(cs *mcp.ClientSession) []string {
		t.Helper()
		lr, err := cs.ListResources(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var uris []string
		for _, r := range lr.Resources {
			uris = append(uris, r.URI)
		}
		return uris
	}
	before := list(cs)
	if _, err := k.snaps.For("").Create("a", "sb-fake", func(io.Writer) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if after := list(cs); !slices.Equal(before, after) || !slices.Equal(after, []string{PolicyURI}) {
		t.Fatalf("resources/list on 2026-07-28 was %v, then %v after a snapshot; want the policy alone", before, after)
	}
	old, _ := serveAt(t, d, "2025-11-25")
	if got := list(old); len(got) != 2 {
		t.Fatalf("resources/list on 2025-11-25 is %v, want the policy and the snapshot", got)
	}
}
