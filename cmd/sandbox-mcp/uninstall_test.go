package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// TestUninstall: uninstall removes the project's containers (refusing while
// one runs, unless forced), networks, images (a child built on a parent
// included, whatever order the engine lists them in), the nftables table
// and the state directory's own files, keeping a file it did not make. The
// test narrows the scope to objects it labels itself, and a table of its
// own, so the other tests on the engine keep theirs.
func TestUninstall(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Docker engine and nftables")
	}
	cli := testenv.Engine(t)
	base := testenv.TestImage(t)
	b := make([]byte, 5)
	rand.Read(b)
	id := hex.EncodeToString(b)
	label := "io.sandbox-mcp.test-uninstall=" + id
	docker := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command("docker", args...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	parent, child := "sandbox-mcp-uninstall-test:"+id, "sandbox-mcp-uninstall-test:"+id+"-child"
	netName := "sandbox-mcp-uninstall-" + id
	t.Cleanup(func() {
		testenv.RemoveLabelled(cli, "io.sandbox-mcp.test-uninstall", id)
		exec.Command("docker", "network", "rm", netName).Run()
		exec.Command("docker", "rmi", "-f", child, parent).Run()
	})
	docker("FROM "+base+"\nLABEL io.sandbox-mcp.source-hash=uninstall-test "+label+"\n", "build", "-q", "-t", parent, "-")
	docker("FROM "+parent+"\nLABEL io.sandbox-mcp.runtime=1\n", "build", "-q", "-t", child, "-")
	// An image of the operator's built on one of ours carries our labels
	// but a name of its own: it is kept.
	user := "uninstall-user-test:" + id
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", user).Run() })
	docker("FROM "+base+"\nLABEL io.sandbox-mcp.source-hash=uninstall-test "+label+" owner=operator\n", "build", "-q", "-t", user, "-")
	docker("", "network", "create", "--internal", "--label", "io.sandbox-mcp=1", "--label", label, netName)
	docker("", "create", "--label", "io.sandbox-mcp=1", "--label", label, child, "true")
	docker("", "run", "-d", "--label", "io.sandbox-mcp=1", "--label", label, "--network", netName, child, "sleep", "300")

	table := "sandbox-mcp-test-" + id
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: table})
	if err := c.Flush(); err != nil {
		t.Fatalf("make table %s: %v", table, err)
	}
	t.Cleanup(func() {
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: table})
		c.Flush()
	})

	dir := t.TempDir()
	state, shared := filepath.Join(dir, "state"), filepath.Join(dir, "shared")
	for _, d := range []string{state, shared} {
		os.MkdirAll(filepath.Join(d, "snapshots"), 0o700)
		os.WriteFile(filepath.Join(d, "snapshots", "snap-0.tar"), []byte("x"), 0o600)
		os.WriteFile(filepath.Join(d, "audit.key"), []byte("k"), 0o600)
	}
	os.WriteFile(filepath.Join(shared, "mine.txt"), []byte("keep"), 0o600)

	ctx := context.Background()
	sc := uninstallScope{label: label, stateDir: state, table: table}
	var out bytes.Buffer
	// A running sandbox means a live server: nothing is removed.
	if err := uninstall(ctx, cli, sc, &out); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("with a running sandbox: %v\n%s", err, out.String())
	}
	if out.Len() != 0 || len(testenv.Containers(t, cli, "io.sandbox-mcp.test-uninstall", id)) != 2 {
		t.Fatalf("removed something while refusing:\n%s", out.String())
	}
	// A dry run says what it would remove, running sandboxes included, and
	// removes nothing.
	sc.dryRun = true
	if err := uninstall(ctx, cli, sc, &out); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Count(s, "would remove container") != 2 || !strings.Contains(s, "would remove image "+child) ||
		!strings.Contains(s, "would remove network "+netName) || len(testenv.Containers(t, cli, "io.sandbox-mcp.test-uninstall", id)) != 2 {
		t.Fatalf("dry run:\n%s", s)
	}
	out.Reset()
	sc.force, sc.dryRun = true, false
	if err := uninstall(ctx, cli, sc, &out); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"removed image " + parent, "removed image " + child, "removed network " + netName, "removed nftables table inet " + table, "removed state directory " + state} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if n := testenv.Containers(t, cli, "io.sandbox-mcp.test-uninstall", id); len(n) != 0 {
		t.Errorf("containers left: %v", n)
	}
	for _, obj := range [][]string{{"image", "inspect", parent}, {"image", "inspect", child}, {"network", "inspect", netName}} {
		if exec.Command("docker", obj...).Run() == nil {
			t.Errorf("docker %s: still there", strings.Join(obj, " "))
		}
	}
	tables, _ := c.ListTablesOfFamily(nftables.TableFamilyINet)
	for _, tb := range tables {
		if tb.Name == table {
			t.Errorf("table %s still there", table)
		}
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state directory still there: %v", err)
	}
	if exec.Command("docker", "image", "inspect", user).Run() != nil || !strings.Contains(s, "kept image "+user) {
		t.Errorf("the operator's image %s was not kept, or not named:\n%s", user, s)
	}
	// The base image, which carries no label of the test, is untouched.
	if exec.Command("docker", "image", "inspect", base).Run() != nil {
		t.Errorf("the test image %s was removed", base)
	}

	// A state directory shared with other files keeps them.
	out.Reset()
	if err := uninstall(ctx, cli, uninstallScope{label: label, stateDir: shared}, &out); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(shared)
	if len(ents) != 1 || ents[0].Name() != "mine.txt" || !strings.Contains(out.String(), "kept what it did not make: mine.txt") {
		t.Errorf("shared state directory: %v\n%s", ents, out.String())
	}
}
