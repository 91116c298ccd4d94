package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Sweep removes what servers that are gone left behind: their stopped
// sandbox containers, their networks no container uses, and the firewall
// rules of networks that no longer exist. Failures of single objects are
// logged; the error is for a sweep that could not run.
func (d *Docker) Sweep(ctx context.Context) error {
	_, cerr := d.sweepContainers(ctx)
	_, nerr := d.sweepNetworks(ctx)
	return errors.Join(cerr, nerr)
}

// sweepContainers removes sandbox containers that are provably orphaned:
// stopped ones (a running sandbox's agent ends, and its container is
// removed, as soon as its server lets go of the stream), and ones created
// but never started long ago. It never touches a running container: that
// belongs to a live server beside this one. It returns the number removed.
func (d *Docker) sweepContainers(ctx context.Context) (int, error) {
	list, err := d.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelManaged+"=1"),
	})
	if err != nil {
		return 0, engineError("list containers", err)
	}
	n := 0
	now := time.Now()
	for _, c := range list.Items {
		if !orphaned(string(c.State), time.Unix(c.Created, 0), now) &&
			!(string(c.State) == "created" && ownerGone(c.Labels)) {
			continue
		}
		if err := removeContainer(ctx, d.cli, c.ID); err != nil {
			d.log.Warn("sweep: remove container", "container", c.ID, "err", err)
			continue
		}
		n++
		d.log.Info("swept orphaned container", "container", c.ID[:12], "state", c.State,
			"sandbox", c.Labels[LabelSandbox], "instance", c.Labels[LabelInstance])
	}
	return n, nil
}

// orphaned decides whether a labelled container in the given state, made at
// created, is left over from a server that is gone.
func orphaned(state string, created, now time.Time) bool {
	switch state {
	case "exited", "dead":
		return true
	case "created":
		return now.Sub(created) > orphanGrace
	}
	return false // running, paused, restarting, removing: a live server's
}

// sweepNetworks removes sandbox networks no container uses whose owner is
// gone (or that are older than the grace period), and firewall rules of
// networks that no longer exist.
func (d *Docker) sweepNetworks(ctx context.Context) (int, error) {
	list, err := d.cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", LabelManaged+"=1")})
	if err != nil {
		return 0, engineError("list networks", err)
	}
	removed := 0
	now := time.Now()
	for _, nw := range list.Items {
		insp, err := d.cli.NetworkInspect(ctx, nw.ID, client.NetworkInspectOptions{})
		if err != nil || len(insp.Network.Containers) > 0 {
			continue
		}
		if nw.Labels[LabelInstance] == d.cfg.Instance {
			continue // ours: removed with its sandbox
		}
		if !ownerGone(nw.Labels) && now.Sub(nw.Created) < orphanGrace {
			continue
		}
		if _, err := d.cli.NetworkRemove(ctx, nw.ID, client.NetworkRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
			d.log.Warn("sweep: remove network", "network", nw.Name, "err", err)
			continue
		}
		removed++
		d.log.Info("swept orphaned network", "network", nw.Name, "instance", nw.Labels[LabelInstance])
	}
	if d.fw != nil {
		// The networks are listed again, after the rules: see sweep.
		live := func() (map[string]bool, error) {
			list, err := d.cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", LabelManaged+"=1")})
			if err != nil {
				return nil, engineError("list networks", err)
			}
			names := make(map[string]bool, len(list.Items))
			for _, nw := range list.Items {
				names[nw.Name] = true
			}
			return names, nil
		}
		if err := d.fw.sweep(live); err != nil {
			d.log.Warn("sweep firewall rules", "err", err)
		}
	}
	return removed, nil
}

// RemoveLeftovers removes what this server's sandboxes left on the engine:
// every container and network that carries its instance label, and the
// firewall rules it still keeps (backend.Leftovers). The server calls it
// once, after it removed every sandbox (and no Start runs any more), so
// whatever it finds is left over:
// an object whose create the engine finished only after its start gave up
// on it (see DefaultCreateGrace), or one whose removal failed. Each object
// is logged; the error joins what could not be removed. What Detach let go
// of is not left over: it stays for the next server.
func (d *Docker) RemoveLeftovers(ctx context.Context) error {
	var errs []error
	list, err := d.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelInstance+"="+d.cfg.Instance),
	})
	if err != nil {
		errs = append(errs, engineError("list this server's containers", err))
	}
	for _, c := range list.Items {
		if d.isKept(c.ID) {
			continue // left running for the next server (Detach)
		}
		d.log.Warn("removing a container left behind", "container", c.ID[:12], "state", c.State, "sandbox", c.Labels[LabelSandbox])
		if err := removeContainer(ctx, d.cli, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove container %s: %w", c.ID[:12], err))
		}
	}
	ids, err := d.ownNetworks(ctx, "")
	if err != nil {
		errs = append(errs, engineError("list this server's networks", err))
	}
	for _, id := range ids {
		if d.isKept(id) {
			continue
		}
		d.log.Warn("removing a network left behind", "network", id[:12])
		if err := removeNetwork(ctx, d.cli, id); err != nil {
			errs = append(errs, fmt.Errorf("remove network %s: %w", id[:12], err))
		}
	}
	if d.fw != nil {
		if err := d.fw.releaseAll(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
