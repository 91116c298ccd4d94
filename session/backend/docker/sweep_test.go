package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// randomID returns 8 random hex digits, for names no other test uses.
func randomID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// TestSweepLeftoverNetwork: the sweep removes the network of a server that
// no longer runs, and leaves alone the one a live server just made.
func TestSweepLeftoverNetwork(t *testing.T) {
	cli := testenv.Engine(t)
	d, err := New(Config{Client: cli, Instance: "test-sweep-" + randomID()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A network a server that no longer runs left behind: its labels name
	// this host and a pid that is gone.
	labels := ownerLabels()
	labels[LabelPID] = "999999999"
	labels[LabelManaged] = "1"
	labels[LabelInstance] = "dead-" + randomID()
	name := "sandbox-mcp-leftover-" + randomID()
	if _, err := cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Driver: "bridge", Internal: true, Labels: labels}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.NetworkRemove(context.Background(), name, client.NetworkRemoveOptions{}) })
	// One of a live server's, just made: left alone.
	live := ownerLabels()
	live[LabelManaged] = "1"
	live[LabelInstance] = "live-" + randomID()
	liveName := "sandbox-mcp-live-" + randomID()
	if _, err := cli.NetworkCreate(ctx, liveName, client.NetworkCreateOptions{Driver: "bridge", Internal: true, Labels: live}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.NetworkRemove(context.Background(), liveName, client.NetworkRemoveOptions{}) })

	if _, err := d.sweepNetworks(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.NetworkInspect(ctx, name, client.NetworkInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("the dead server's network was not swept: %v", err)
	}
	if _, err := cli.NetworkInspect(ctx, liveName, client.NetworkInspectOptions{}); err != nil {
		t.Errorf("a live server's network was swept: %v", err)
	}
}

func TestOwnerGone(t *testing.T) {
	if ownerGone(ownerLabels()) {
		t.Fatal("this process counts as gone")
	}
	l := ownerLabels()
	l[LabelStart] = "1"
	if !ownerGone(l) {
		t.Fatal("a reused pid (other start time) counts as alive")
	}
	l = ownerLabels()
	l[LabelHost] = "another-host"
	l[LabelPID] = "999999999"
	if ownerGone(l) {
		t.Fatal("another host's process cannot be known gone")
	}
	if ownerGone(map[string]string{}) {
		t.Fatal("no labels: unknown, not gone")
	}
}
