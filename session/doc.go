// Package session runs one sandbox per MCP session: it starts the sandbox's
// instance (a hardened container) at a session's first call, talks to the
// agent inside it over the instance's stream (through package agentclient),
// and removes it when the session ends. It also keeps containers started
// ahead of need (the warm pool), removes idle ones after saving their workspace, and keeps
// snapshots in the state directory.
//
// The sandbox's life is a state machine that knows no engine: a container
// that is lost (its agent died, it was removed from outside, or it sat idle
// too long) is reported by the next call, and the call after that gets a
// fresh one, restored from the sandbox's latest snapshot. What runs the
// instances is a backend (package session/backend), Options.Backend, which
// main builds: Docker containers (session/backend/docker) or Kubernetes pods
// (session/backend/kube). This package links neither.
//
// The files: registry.go (the Manager, its options, the sandboxes by key
// and id), sandbox.go (one sandbox and its calls), instance.go (one
// instance's start, heartbeats and removal), fileops.go and jobs.go (the
// file and job calls), types.go (the requests and results, the agent
// client's), pool.go (the warm pool), reap.go (idle removal), seed.go
// (--workspace-from), secrets.go and sweep.go.
// Snapshots are kept by package snapshot; the server reaches a caller's
// through its view, Snapshots().For(caller).
//
// Package session knows the agent protocol; it does not know MCP. Callers
// key sandboxes by an opaque string of their own.
package session
