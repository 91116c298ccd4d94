// Package agentclient is the server's end of the agent protocol: a Conn
// talks to one sandbox's agent (package agent) over the frames of package
// agentproto, on a stream the caller opened (a container's attach stream, a
// pod's exec stream, or pipes in a test).
//
// Everything read from the agent is untrusted: every reply is checked
// against what was asked (its kind, its request id, its sizes, its counts),
// and a reply that breaks the protocol ends the connection. A request the
// agent refuses by design (an error frame) fails only its call.
//
// The files: conn.go (the connection: hello, lease, the read loop, the
// requests in flight), requests.go (exec, read, write, list, resolve,
// snapshot and restore, and the round trip they share), fileops.go (edit,
// delete, move), jobs.go, setup.go, errors.go.
//
// The package knows neither a sandbox's life nor what runs it: it links no
// Docker and not package session (internal/layout checks both).
package agentclient
