// Package backend is the seam between a sandbox's life (package session) and
// what runs it: Docker containers (package session/backend/docker) today, other
// backends (Kubernetes pods, a test's in-process agent) beside it.
//
// A backend starts instances: one sandbox's container or pod, the agent
// running in it and attached, its protocol stream handed back as plain
// readers and writers. It knows nothing of the protocol, of snapshots, of
// idle timeouts or of MCP: session's state machine drives it through the
// three calls of Backend and the few of Instance.
//
// What the interfaces promise is checked on every backend by the
// conformance suite in session/backend/backendtest.
package backend

import (
	"context"
	"errors"
	"io"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

// Backend runs sandbox instances. Its methods are safe for concurrent use.
type Backend interface {
	// Prepare makes ready what every instance needs (the runtime image,
	// the host's firewall chain). The server calls it in the background
	// from its start, before any Start, and again after it failed; it must
	// be safe to call again after a failure. It tells step what it is
	// doing, each time that changes, so that the log and the calls waiting
	// for it can say so. An error says what the operator must fix.
	Prepare(ctx context.Context, step func(Step)) error
	// Start starts one instance, its agent running with the protocol
	// stream attached, and returns when the agent's stream is open (not
	// when the agent said hello: the caller reads that). Errors the model
	// can act on are *errcode.Error (UNAVAILABLE for an engine fault).
	//
	// On failure, and when ctx ends at any point of the start, Start
	// leaves nothing behind when it returns: every object it makes (a
	// container, a pod, a network, a firewall rule, a proxy listener) is
	// the start's from the moment the request that creates it is sent,
	// and is removed before Start returns. A request the engine may carry
	// out after its client gave up is not cut when ctx ends: Start waits
	// for its answer, for a bounded time, so that the object's id is
	// known; past that bound the object is sought by name or label. So
	// Start may return a little after ctx's end, never with an object of
	// the abandoned start still on the engine (except one the engine makes
	// after the bound, which the backend's own cleanup at shutdown and the
	// sweep find by label).
	Start(ctx context.Context, spec InstanceSpec) (Instance, error)
	// Sweep removes what servers that are gone left behind: instances
	// whose stream no server holds any more, their networks and rules. It
	// never touches what a live server (this one or another) still uses.
	Sweep(ctx context.Context) error
}

// Step is what a backend's Prepare is doing, for the log and for the tool
// calls that wait for it: "building the sandbox image" because "the agent
// changed since the last start".
type Step struct {
	// What is being done, as a phrase: "building the sandbox image".
	What string
	// Why it is needed now ("" when it is done at every start).
	Why string
	// Usually says how long this step usually takes, in words ("1-3 min
	// on a loaded engine"); "" for a moment.
	Usually string
}

// Instance is one started sandbox instance: a container, a pod.
type Instance interface {
	// Name is the backend's name for the instance (the container's name,
	// the pod's), which the backend's own tools accept.
	Name() string
	// Stdout is the agent's protocol stream, demultiplexed: the agent's
	// frames only. It ends (io.EOF, or the stream's error) when the
	// instance ends or its stream is cut: that end is how the server
	// learns an instance is gone, so a backend must not leave it open
	// when its instance is removed from outside.
	Stdout() io.Reader
	// Stdin is the agent's input. Closing it ends the agent, and with it
	// the instance.
	Stdin() io.WriteCloser
	// StderrTail returns the last lines the agent wrote to its stderr (or
	// "none"), for the error that reports an agent that did not start.
	StderrTail() string
	// Remove removes the instance and what was made for it (its network,
	// firewall rules, proxy listener) and waits until the backend has let
	// go of it. It is safe to call more than once and concurrently; later
	// calls wait for the first and return its result.
	Remove(ctx context.Context) error
}

// AgentEnv is implemented by an Instance that keeps the sandbox's
// environment out of its definition, because others can read that (a pod
// spec is stored in etcd and shown to anyone who may get pods): the server
// hands AgentEnv to the agent in its setup request
// (agentproto.SetupRequest.Env) before any command runs, and the agent
// adds it to every command's environment. An Instance without it got the
// whole InstanceSpec.Env in its definition (a Docker container's config).
type AgentEnv interface {
	AgentEnv() []string
}

// InstanceSpec is what an instance is started with. Every field comes from
// the operator's policy and the server's options; nothing here comes from a
// tool argument.
type InstanceSpec struct {
	// Sandbox is the id of the sandbox the instance serves; Generation
	// counts its instances from 1. Together they name the instance.
	Sandbox    string
	Generation int
	// UID and GID are the sandbox user every command runs as (never 0).
	UID, GID int
	// Image is the base image of an operator's template ("" for the
	// backend's own): the backend runs it with the agent, as it does its
	// own, but without the content a read-only default workspace has in
	// its image. The Docker backend must have it in docker.Config.Images.
	Image string
	// Env is the sandbox's whole environment (NAME=VALUE). The backend
	// adds the proxy's variables when Proxy is set; nothing else enters.
	// It holds values the operator may not want shown (--env values, the
	// secrets' placeholders): a backend whose instance definition others
	// can read delivers it through the agent instead (see AgentEnv).
	Env []string
	// Limits bound the instance's resources.
	Limits Limits
	// ReadOnly mounts the workspace read-only.
	ReadOnly bool
	// Proxy is the egress proxy. nil means no network at all; otherwise
	// the instance gets a network of its own whose only way out is this
	// proxy, served (netproxy.Proxy.Serve) for the instance's address
	// alone, until Remove.
	Proxy *netproxy.Proxy
}

// Limits bound one instance. Zero values are not "no limit": the server
// always sets every field.
type Limits struct {
	Memory         int64 // bytes of memory; no swap beyond it
	NanoCPUs       int64 // CPU quota in 1e-9 CPUs
	Pids           int64 // processes
	NoFile         int64 // open files per process (soft and hard)
	WorkspaceBytes int64 // size of /workspace
	TmpBytes       int64 // size of /tmp
}

// Image is implemented by a backend that runs its instances from an image
// it prepares itself (Docker's runtime image: the sandbox image with the
// agent). The server reports it (doctor, the ready log) and reads the
// image's toolbox manifest for its instructions; a backend without it
// (Kubernetes pods get the agent from an init container) has nothing to
// report.
type Image interface {
	// RuntimeImage is the tag of the image instances run, once prepared.
	RuntimeImage() string
	// AgentMountPath is the host path of the agent bind-mounted into
	// instances, or "" when the runtime image holds it, once prepared.
	AgentMountPath() string
	// Toolbox is the sandbox image's toolbox manifest (JSON), or "" when
	// the image has none or it cannot be read in 2 s.
	Toolbox(ctx context.Context) string
}

// ReadOnlySeed is implemented by a backend that can bake a read-only
// workspace's starting content into what its instances run (a read-only
// workspace cannot be filled after the start). The server calls
// SeedReadOnly at most once, before Prepare, with the content's digest and a
// function returning independent readers of its tar stream; without it a
// read-only workspace cannot start with content.
type ReadOnlySeed interface {
	SeedReadOnly(digest string, tar func() io.Reader)
}

// Reattacher is implemented by a backend whose instances outlive the
// server's stream to them (Docker: the container's stdin stays open past an
// attach, and the agent lives on its lease): a server started again
// attaches anew to an instance an earlier server started, by its Name,
// and resumes the agent's protocol on the new stream
// (agentclient.Resume). An instance that is gone (or that the backend
// cannot take over) is ErrGone. proxy is the egress proxy the instance's
// network is to be served by again, as InstanceSpec.Proxy; nil when the
// server cannot give it the egress it had (then an instance with a
// network is removed and ErrGone).
type Reattacher interface {
	Reattach(ctx context.Context, name string, proxy *netproxy.Proxy) (Instance, error)
}

// Detacher is implemented by an Instance that can outlive its server's
// stream to it (a Reattacher's). Detach lets go of the instance without
// ending it, for a server that stops and leaves the instance to the next
// one on its state directory: the stream is closed as if the server had
// died (the agent lives on its lease), what this server ran for it (the
// egress proxy's listener) stops, and what guards it (its network, the
// firewall rules) stays. After Detach, Remove and closing Stdin leave the
// instance alone, and the backend's RemoveLeftovers does not count it as
// left over.
type Detacher interface {
	Detach()
}

// ErrSuperseded ends the stream of an instance that another server took
// over (a Reattach elsewhere): the instance runs on, that server's now.
var ErrSuperseded = errors.New("another server took the sandbox over")

// ErrGone is Reattach's error for an instance that no longer runs.
var ErrGone = errors.New("the sandbox's container is gone")

// ImageMissingError is (wrapped in) Start's error when the instance's
// image (InstanceSpec.Image, a template's) is not where the backend runs
// instances from (the engine, the node): the operator must build or load
// it. The session names the template in what the caller sees.
type ImageMissingError struct {
	// Image is the image's name.
	Image string
	// Where completes "image X is not ...": "on this Docker engine, and
	// nothing is pulled".
	Where string
}

func (e *ImageMissingError) Error() string { return "image " + e.Image + " is not " + e.Where }

// Leftovers is implemented by a backend that may leave objects behind
// after a start gave up (an engine that finished a create its client had
// abandoned): the server calls RemoveLeftovers once, after it removed
// every instance and no Start runs any more, so that whatever carries this
// server's mark is left over and goes.
type Leftovers interface {
	RemoveLeftovers(ctx context.Context) error
}
