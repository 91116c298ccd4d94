package tools

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/preview"
)

// NameExpose is the name of the tool that opens a preview of a port.
const NameExpose = "sandbox_expose"

// ExposeIn is sandbox_expose's input.
type ExposeIn struct {
	Port    int    `json:"port" jsonschema:"The TCP port a server listens on inside the sandbox."`
	Path    string `json:"path,omitempty" jsonschema:"Where the URL points under the port's root, e.g. docs/."`
	WaitMS  int64  `json:"wait_ms,omitempty" jsonschema:"Wait up to this many milliseconds (at most 60000) for something to listen on the port."`
	Revoke  bool   `json:"revoke,omitempty" jsonschema:"Close the port's preview instead: its URL stops working at once."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox id. Default: this session's sandbox."`
}

// ExposeOut is sandbox_expose's output.
type ExposeOut struct {
	Sandbox   string `json:"sandbox"`
	Port      int    `json:"port"`
	URL       string `json:"url,omitempty" jsonschema:"The URL a person opens; anyone who has it reaches the port until expires_at."`
	ExpiresAt string `json:"expires_at,omitempty" jsonschema:"RFC 3339."`
	Listening bool   `json:"listening" jsonschema:"Something listens on the port now."`
	Revoked   int    `json:"revoked,omitempty" jsonschema:"Previews closed (with revoke)."`
	Hint      string `json:"hint,omitempty"`
}

// Previews opens and closes previews; *preview.Registry is one.
type Previews interface {
	Expose(t preview.Target) (preview.Info, error)
	Revoke(owner, sandbox string, port int) int
}

// PortSandbox is a sandbox whose ports can be reached through its agent;
// *session.Sandbox is one.
type PortSandbox interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
	WaitPort(ctx context.Context, port int, wait time.Duration) (bool, error)
	Done() <-chan struct{}
}

func exposeDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameExpose,
		Title: "Open a port in a browser",
		Description: "Use it when a person should open a server you started in the sandbox (a dev server) in a browser. " +
			"Returns a URL that reaches 127.0.0.1:port inside the sandbox until expires_at, even without network. wait_ms waits for the port to listen; revoke closes it.",
		InputSchema: inputSchema[ExposeIn](func(s *jsonschema.Schema) {
			p := s.Properties["port"]
			p.Minimum, p.Maximum = new(float64(1)), new(float64(65535))
			w := s.Properties["wait_ms"]
			w.Minimum, w.Maximum = new(float64(0)), new(float64(policy.MaxPortWait))
			s.Properties["path"].MaxLength = new(policy.MaxExposePath)
		}),
		OutputSchema: outputSchema[ExposeOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:          "Open a port in a browser",
			IdempotentHint: true,
			OpenWorldHint:  ptr(true),
		},
	}
}

func (in ExposeIn) target() string { return in.Sandbox }

func (d *Deps) checkExpose(in ExposeIn) (ExposeIn, error) {
	if dec := policy.CheckExpose(in.Port, in.Path, in.WaitMS); !dec.Allow {
		return in, dec.Err()
	}
	if d.Previews == nil && !in.Revoke {
		why := d.PreviewsOff
		if why == "" {
			why = "this server serves no previews"
		}
		return in, errcode.Errorf(errcode.PolicyDenied, "%s; a person can still see the port's output through sandbox_exec (e.g. curl -s localhost:%d)", why, in.Port)
	}
	return in, nil
}

func (d *Deps) expose(ctx context.Context, c *call, sb Sandbox, in ExposeIn) (*mcp.CallToolResult, ExposeOut, error) {
	out := ExposeOut{Sandbox: sb.ID(), Port: in.Port}
	owner := d.Sessions.Owner(c.req)
	if in.Revoke {
		if d.Previews != nil {
			out.Revoked = d.Previews.Revoke(owner, sb.ID(), in.Port)
		}
		out.Hint = fmt.Sprintf("%d preview(s) of port %d closed; their URLs now answer 404", out.Revoked, in.Port)
		return textResult(out.Hint), out, nil
	}
	ps, ok := sb.(PortSandbox)
	if !ok {
		return nil, out, errors.New("tools: this sandbox cannot reach its ports")
	}
	listening, err := ps.WaitPort(ctx, in.Port, time.Duration(in.WaitMS)*time.Millisecond)
	if err != nil {
		return nil, out, err
	}
	info, err := d.Previews.Expose(preview.Target{
		Owner: owner, Sandbox: sb.ID(), Port: in.Port, Path: in.Path, Dial: ps.DialPort, Done: ps.Done(),
	})
	if errors.Is(err, preview.ErrTooMany) {
		return nil, out, errcode.Errorf(errcode.Busy, "%v", err)
	}
	if err != nil {
		return nil, out, errcode.Errorf(errcode.Unavailable, "%v", err)
	}
	out.URL, out.ExpiresAt, out.Listening = info.URL, info.Expires.UTC().Format(time.RFC3339), listening
	if listening {
		out.Hint = "Give the person this URL; anyone who has it reaches the port until expires_at. Links in the app must be relative (or use the base path " + preview.Prefix + info.Token + "/)"
	} else {
		out.Hint = fmt.Sprintf("Nothing listens on port %d yet", in.Port)
		if in.WaitMS > 0 {
			out.Hint += fmt.Sprintf(" (waited %d ms)", in.WaitMS)
		}
		out.Hint += "; the URL works once a server listens on 127.0.0.1 or 0.0.0.0 there: check the server's job with sandbox_job"
	}
	text := fmt.Sprintf("%s\nexpires %s; listening: %v\n%s\n", out.URL, out.ExpiresAt, out.Listening, out.Hint)
	return textResult(text), out, nil
}
