package engine

import (
	"context"
	"errors"
	"slices"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// createFails is an engine whose ContainerCreate fails, as a cancelled
// call does (after the engine may have made the container) or as a refusal
// does; it records the removals asked for.
type createFails struct {
	Engine  // the calls not overridden here are not expected
	err     error
	removed []string
}

func (e *createFails) ContainerCreate(ctx context.Context, _ client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	if err := ctx.Err(); err != nil {
		return client.ContainerCreateResult{}, err
	}
	return client.ContainerCreateResult{}, e.err
}

func (e *createFails) ContainerRemove(_ context.Context, id string, _ client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	e.removed = append(e.removed, id)
	return client.ContainerRemoveResult{}, nil
}

func (e *createFails) ContainerInspect(context.Context, string, client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	return client.ContainerInspectResult{}, cerrdefs.ErrNotFound
}

// TestStartCutDuringCreateRemovesByName: a start cancelled while its
// create was under way removes the container by name (the engine may have
// made it without the caller learning its id); a create the engine refused
// leaves nothing to remove.
func TestStartCutDuringCreateRemovesByName(t *testing.T) {
	spec := backend.InstanceSpec{Sandbox: "sb-1", Generation: 2, UID: 1000, GID: 1000}

	e := &createFails{}
	d, err := New(Config{Client: e, Instance: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Start(ctx, spec); err == nil {
		t.Fatal("Start succeeded with its context cancelled")
	}
	if want := []string{"sandbox-mcp-sb-1-2"}; !slices.Equal(e.removed, want) {
		t.Errorf("removed %q, want %q", e.removed, want)
	}

	e = &createFails{err: errors.New("no such image")}
	if d, err = New(Config{Client: e, Instance: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(context.Background(), spec); err == nil {
		t.Fatal("Start succeeded with the create refused")
	}
	if len(e.removed) != 0 {
		t.Errorf("a refused create removed %q: that name may be another's", e.removed)
	}
}
