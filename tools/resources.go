package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// Resource addresses.
const (
	PolicyURI           = "sandbox://policy"
	SnapshotURIPrefix   = "sandbox://snapshots/"
	SnapshotURITemplate = SnapshotURIPrefix + "{id}"
)

// PolicyView is the effective policy as the sandbox://policy resource shows
// it. Durations are in milliseconds; secrets never appear.
type PolicyView struct {
	policy.Policy
	ExecTimeoutMS    int64  `json:"exec_timeout_ms"`
	MaxExecTimeoutMS int64  `json:"max_exec_timeout_ms"`
	MaxCallWaitMS    int64  `json:"max_call_wait_ms"`
	MaxArgvBytes     int    `json:"max_argv_bytes"`
	MaxEnvBytes      int    `json:"max_env_bytes"`
	Image            string `json:"image,omitempty"`
	// Toolbox is the image's manifest (what it has and lacks), when the
	// image carries one and the backend can read it.
	Toolbox  *Toolbox `json:"toolbox,omitempty"`
	EnvNames []string `json:"env,omitempty"`
	// Secrets are the variables that hold a placeholder the egress proxy
	// replaces by a real credential in requests to the hosts listed.
	Secrets []SecretView `json:"secrets,omitempty"`
	// ImplicitSandbox is the sandbox of a call without `sandbox` on MCP
	// 2026-07-28 (see Sessionless): "connection" (stdio), "none" or
	// "per-caller" (HTTP, --default-sandbox). On older versions it is
	// the MCP session's.
	ImplicitSandbox string `json:"implicit_sandbox,omitempty"`
	// The HTTP transport's caps; absent over stdio.
	MaxSessions          int `json:"max_sessions,omitempty"`
	MaxSessionsPerCaller int `json:"max_sessions_per_caller,omitempty"`
	MaxCallsPerCaller    int `json:"max_calls_per_caller,omitempty"`
	// Templates are the operator's named sandbox templates, each with
	// its whole policy (what a sandbox made from it may do).
	Templates []TemplateView `json:"templates,omitempty"`
	// SandboxNetwork is the reading session's own sandbox's live
	// allowlist (base, approved, dropped), once it has a sandbox and the
	// server an egress proxy.
	SandboxNetwork *NetworkOut `json:"sandbox_network,omitempty"`
}

// TemplateView is one operator template as the policy resource and the
// instructions show it: its name and its policy (the server-wide fields,
// the HTTP caps among them, are the default's and left out).
type TemplateView struct {
	Name string `json:"name"`
	PolicyView
}

// SecretView is a secret as the model sees it: its name and hosts, never
// its value.
type SecretView struct {
	Name  string   `json:"name"`
	Hosts []string `json:"hosts"`
	Note  string   `json:"note"`
}

// SecretViewOf describes, for the policy resource, the secret of the
// variable name that the egress proxy puts into requests to hosts.
func SecretViewOf(name string, hosts []string) SecretView {
	return SecretView{Name: name, Hosts: hosts, Note: "$" + name + " holds a placeholder; use it as the credential (header, URL user info) in https requests to these hosts and the proxy puts the real value in its place"}
}

// ViewOf returns the resource view of p.
func ViewOf(p policy.Policy, image string, env []string) PolicyView {
	v := PolicyView{Policy: p, ExecTimeoutMS: p.ExecTimeout.Milliseconds(), MaxExecTimeoutMS: p.MaxExecTimeout.Milliseconds(), MaxCallWaitMS: p.MaxCallWait.Milliseconds(), Image: image,
		MaxArgvBytes: policy.MaxArgvBytes, MaxEnvBytes: policy.MaxEnvBytes}
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		v.EnvNames = append(v.EnvNames, name)
	}
	return v
}

func registerResources(s *mcp.Server, d *Deps) {
	s.AddResource(&mcp.Resource{
		URI:         PolicyURI,
		Name:        "policy",
		Title:       "Effective sandbox policy",
		Description: "What this server lets a sandbox do: exec mode and allowlist, read-only workspace, size caps, timeouts, limits, network.",
		MIMEType:    "application/json",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		view := d.PolicyView
		if sb, ok := d.Sessions.existing(req.Session); ok {
			if nsb, ok := sb.(networkSandbox); ok {
				if l, ok := nsb.NetworkLayers(); ok {
					view.SandboxNetwork = &NetworkOut{Sandbox: sb.ID(), Base: l.Base, Approved: l.Approved, CallerApproved: l.CallerApproved, Dropped: l.Dropped, Offline: l.Offline}
				}
			}
		}
		b, err := json.MarshalIndent(view, "", "  ")
		if err != nil {
			return nil, err
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: PolicyURI, MIMEType: "application/json", Text: string(b)}}}, nil
	})
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: SnapshotURITemplate,
		Name:        "snapshot",
		Title:       "Workspace snapshot",
		Description: "A snapshot made by sandbox_snapshot: its record (JSON) and, when it fits the server's file cap, the tar archive itself (otherwise the record's hint says how to get it).",
		MIMEType:    "application/x-tar",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		uri := req.Params.URI
		id, ok := strings.CutPrefix(uri, SnapshotURIPrefix)
		owner := ""
		if d.Sessions.OwnerOf != nil {
			owner = d.Sessions.OwnerOf(req.Extra)
		}
		if !ok {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		info, f, err := d.Sessions.snapshotsOf(owner).Open(id)
		if errors.Is(err, snapshot.ErrNotFound) {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		if err != nil {
			return nil, err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		size := st.Size()
		record := struct {
			snapshot.Info
			Hint string `json:"hint,omitempty"`
		}{Info: info}
		if size > d.Policy.MaxFileBytes {
			record.Hint = fmt.Sprintf("The tar archive (%d bytes) was left out: it is larger than this server's file cap (--max-file-bytes %d). "+
				"Restore it into a sandbox with sandbox_restore and read the files you need there, or ask the operator to run `sandbox-mcp snapshot export %s DIR` on the server.",
				size, d.Policy.MaxFileBytes, id)
		}
		meta, err := json.MarshalIndent(record, "", "  ")
		if err != nil {
			return nil, err
		}
		contents := []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(meta)}}
		if size <= d.Policy.MaxFileBytes {
			// The archive is read once, into a buffer of its size, under a
			// reservation of what it and its base64 in the response take,
			// counted against the server and the reading session.
			r, err := d.budget.reserveFor(ctx, d.budgetKey(req), policy.ResourceReserve(size), reserveWait)
			if err != nil {
				return nil, resourceError(memoryError(err, ""))
			}
			// Given back when ctx ends, after the response is written;
			// the deferred call registers that as the handler returns.
			defer context.AfterFunc(ctx, r.release)
			data := make([]byte, size)
			if _, err := io.ReadFull(f, data); err != nil {
				return nil, fmt.Errorf("reading snapshot %s: %w", id, err)
			}
			contents = append(contents, &mcp.ResourceContents{URI: uri, MIMEType: "application/x-tar", Blob: data})
		}
		return &mcp.ReadResourceResult{Contents: contents}, nil
	})
}

// CodeBusy is the JSON-RPC error code of a resource read refused because
// the server's memory for calls in flight is taken; the message starts
// with BUSY and says what to do. It is in the range JSON-RPC leaves to
// servers.
const CodeBusy = -32000

// resourceError turns a tool error into the JSON-RPC error a resource read
// answers with.
func resourceError(err error) error {
	if e, ok := errcode.As(err); ok {
		return &jsonrpc.Error{Code: CodeBusy, Message: e.Error()}
	}
	return err
}

// listSnapshots adds the caller's snapshots to resources/list (on its last
// page), read fresh from the store each time, so the list follows snapshots
// made, restored, pruned or deleted, and never shows another caller's.
// On MCP 2026-07-28 a list never depends on earlier calls (clients may
// cache it): there resources/list is the policy alone, and a caller finds
// its snapshots with sandbox_snapshot list: true and reads one through
// the snapshot template.
func (d *Deps) listSnapshots(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		lr, ok := res.(*mcp.ListResourcesResult)
		if err != nil || method != "resources/list" || !ok || lr.NextCursor != "" || sessionless(req) {
			return res, err
		}
		owner := ""
		if d.Sessions.OwnerOf != nil {
			owner = d.Sessions.OwnerOf(req.GetExtra())
		}
		mine, err := d.Sessions.snapshotsOf(owner).List()
		if err != nil {
			return nil, err
		}
		for _, in := range mine {
			title := in.Label
			if title == "" {
				title = "snapshot of " + in.Sandbox
			}
			lr.Resources = append(lr.Resources, &mcp.Resource{
				URI:         in.URI(),
				Name:        in.ID,
				Title:       title,
				Description: fmt.Sprintf("workspace of sandbox %s at %s: %d entries, sha256 %s", in.Sandbox, in.CreatedAt.Format(time.RFC3339), in.Files, in.SHA256),
				MIMEType:    "application/x-tar",
				Size:        in.SizeBytes,
			})
		}
		return lr, nil
	}
}

// SetCacheable is the server's cache hints (mcp.ServerOptions.SetCacheable)
// for results MCP 2026-07-28 lets clients and intermediaries cache: a
// snapshot read is its caller's alone ("private"); every list, the policy
// and server/discover are the same for every caller, and the SDK's
// defaults (public, stale at once) stand.
// Before 2026-07-28 resources/list holds the caller's snapshots: private too.
func SetCacheable(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
	switch r := req.(type) {
	case *mcp.ReadResourceRequest:
		if r.Params != nil && strings.HasPrefix(r.Params.URI, SnapshotURIPrefix) {
			c.CacheScope = "private"
		}
	case *mcp.ListResourcesRequest:
		if !sessionless(r) {
			c.CacheScope = "private"
		}
	}
}
