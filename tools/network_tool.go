package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameNetwork is the name of the tool that narrows a sandbox's network.
const NameNetwork = "sandbox_network"

// maxDropArg bounds the entries one call may drop.
const maxDropArg = session.MaxDroppedHosts

// NetworkIn is sandbox_network's input. Nothing in it can allow a host.
type NetworkIn struct {
	Drop    []string `json:"drop,omitempty" jsonschema:"Hosts to drop for the rest of the sandbox's life: host[:port] or *.domain[:port], port default 443."`
	Offline bool     `json:"offline,omitempty" jsonschema:"True: the sandbox reaches no host for the rest of its life."`
	Sandbox string   `json:"sandbox,omitempty" jsonschema:"Sandbox id. Default: this session's sandbox."`
}

func (in NetworkIn) target() string { return in.Sandbox }

// NetworkOut is sandbox_network's output: the sandbox's live allowlist.
type NetworkOut struct {
	Sandbox  string   `json:"sandbox"`
	Base     []string `json:"base" jsonschema:"The hosts the server allows every sandbox."`
	Approved []string `json:"approved" jsonschema:"Hosts a person approved for this sandbox."`
	// CallerApproved are hosts a person allowed for all this caller's
	// sandboxes for an hour, as "host:port until <time>".
	CallerApproved []string `json:"caller_approved,omitempty" jsonschema:"Hosts a person approved for all this caller's sandboxes, each until a time."`
	Dropped        []string `json:"dropped" jsonschema:"Hosts this sandbox dropped; refused whatever else allows them."`
	Offline        bool     `json:"offline" jsonschema:"True when the sandbox went offline: it reaches nothing."`
	Hint           string   `json:"hint,omitempty"`
}

func networkDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameNetwork,
		Title: "Narrow the sandbox's network",
		Description: "Use it when the sandbox no longer needs some allowed hosts (after its installs, say): drop them, or go offline, for the rest of the sandbox's life. " +
			"It only narrows; nothing here allows a host. No arguments: shows the live allowed hosts.",
		InputSchema:  inputSchema[NetworkIn](func(s *jsonschema.Schema) { s.Properties["drop"].MaxItems = intp(maxDropArg) }),
		OutputSchema: outputSchema[NetworkOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Narrow the sandbox's network",
			DestructiveHint: ptr(false),
			IdempotentHint:  true,
			OpenWorldHint:   ptr(false),
		},
	}
}

func (d *Deps) checkNetwork(in NetworkIn) (NetworkIn, error) {
	if len(in.Drop) > 0 {
		if _, err := session.ParseHostPatterns(in.Drop); err != nil {
			return in, errcode.Errorf(errcode.InvalidArgument, "drop: %v", err)
		}
	}
	return in, nil
}

func (d *Deps) network(ctx context.Context, c *call, sb Sandbox, in NetworkIn) (*mcp.CallToolResult, NetworkOut, error) {
	out := NetworkOut{Sandbox: sb.ID()}
	nsb, ok := sb.(networkSandbox)
	if !ok {
		return nil, out, errcode.Errorf(errcode.InvalidArgument, "this sandbox has no egress proxy, so there are no allowed hosts to change")
	}
	if len(in.Drop) > 0 || in.Offline {
		if err := nsb.NarrowNetwork(in.Drop, in.Offline); err != nil {
			return nil, out, err
		}
	}
	l, ok := nsb.NetworkLayers()
	if !ok {
		return nil, out, errcode.Errorf(errcode.InvalidArgument, "this server's sandboxes have no egress proxy (--network is not allowlist), so there are no allowed hosts to change")
	}
	out.Base, out.Approved, out.Dropped, out.Offline = l.Base, l.Approved, l.Dropped, l.Offline
	out.CallerApproved = l.CallerApproved
	switch {
	case out.Offline:
		out.Hint = "This sandbox is offline for the rest of its life: every host is refused"
	case len(in.Drop) > 0:
		out.Hint = fmt.Sprintf("Dropped for the rest of this sandbox's life: %s; nothing can allow them again", strings.Join(in.Drop, ", "))
	}
	return nil, out, nil
}
