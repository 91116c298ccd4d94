package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// attachStdin is the agent's input over an attach: writes go to the
// attach, and closing it ends the attach and removes the container, in
// the background. The container's stdin outlives an attach (StdinOnce is
// false, so that a server started again can attach anew), so closing the
// attach alone would no longer end the agent; backend.Instance promises
// that closing Stdin does.
func (d *Docker) attachStdin(conn io.WriteCloser, id string) io.WriteCloser {
	return &stdinCloser{WriteCloser: conn, end: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := removeContainer(ctx, d.cli, id); err != nil {
			d.log.Warn("remove a container whose stream was closed", "container", id, "err", err)
		}
	}}
}

type stdinCloser struct {
	io.WriteCloser
	once sync.Once
	end  func()
}

func (s *stdinCloser) Close() error {
	err := s.WriteCloser.Close()
	s.once.Do(func() { go s.end() })
	return err
}

// Reattach attaches again to a running sandbox container that a server
// before this one started (backend.Reattacher): the container's stdin is
// the same pipe, so the caller resumes the agent's protocol on it
// (agentclient.Resume). A container that is gone, or no longer running, is
// backend.ErrGone. A sandbox with a network of its own is taken over with
// it (adoptNet) when proxy is set: the proxy serves it again where the
// last server's did, for its address and its credential. Without proxy
// (the server cannot give it the same egress: see backend.Reattacher), or
// when the network cannot be taken over, it is removed and reported gone,
// so the sandbox comes back from its last snapshot.
func (d *Docker) Reattach(ctx context.Context, name string, proxy *netproxy.Proxy) (backend.Instance, error) {
	insp, err := d.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return nil, backend.ErrGone
	}
	if err != nil {
		return nil, engineError("inspect the sandbox container", err)
	}
	ct := insp.Container
	if ct.Config == nil || ct.Config.Labels[LabelManaged] != "1" {
		return nil, fmt.Errorf("docker: %s is not a sandbox container", name)
	}
	if ct.State == nil || !ct.State.Running {
		return nil, backend.ErrGone
	}
	c := &sandboxContainer{d: d, id: ct.ID, name: name}
	if ct.HostConfig != nil && ct.HostConfig.NetworkMode != "none" {
		var why error
		if proxy == nil {
			why = errors.New("this server cannot give it the same egress (it holds secrets, or its template has no network any more)")
		} else {
			c.net, why = d.adoptNet(ct.Config.Labels[LabelSandbox], string(ct.HostConfig.NetworkMode), ct.Config.Env, ct.NetworkSettings, proxy)
		}
		if why != nil {
			d.log.Info("a sandbox with a network could not be taken over; removing it", "container", name, "why", why)
			netName := string(ct.HostConfig.NetworkMode)
			removeContainer(ctx, d.cli, ct.ID)
			if err := removeNetwork(ctx, d.cli, netName); err != nil {
				d.log.Warn("remove network", "network", netName, "err", err) // the sweep takes it later
			}
			if fw, err := d.egressFirewall(); err == nil && fw != nil {
				fw.release(netName)
			}
			return nil, fmt.Errorf("%w: its network could not be taken over (%v)", backend.ErrGone, why)
		}
	}
	att, err := d.cli.ContainerAttach(ctx, ct.ID, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		if c.net != nil {
			// Not taken over after all: it goes with its network.
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			c.Remove(rctx)
			cancel()
		}
		return nil, engineError("attach to the sandbox container", err)
	}
	c.stdin = d.attachStdin(att.Conn, ct.ID)
	c.stdout, c.stderr = demuxAttach(att.Reader, d.log.With("sandbox", ct.Config.Labels[LabelSandbox], "container", ct.ID[:12]))
	return c, nil
}
