package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/audit"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// uninstallScope is what `sandbox-mcp uninstall` removes: everything that
// carries the project's labels, the state directory's own entries and the
// firewall table. Tests narrow it to objects of their own.
type uninstallScope struct {
	// label is an extra key=value every object removed must carry ("" for
	// none: every object of the project).
	label    string
	stateDir string // "" keeps the state directory
	table    string // nftables table; "" keeps it
	force    bool   // remove running sandboxes too
	dryRun   bool
}

// labelPrefix starts every label the project puts on containers, networks
// and images (io.sandbox-mcp, io.sandbox-mcp.runtime, .source-hash, ...).
const labelPrefix = docker.LabelManaged

// stateEntries are what a server makes in --state-dir (snapshots, the
// audit key, the slots with their sandbox records, the agent copies);
// uninstall removes these and the directory if nothing else is in it.
var stateEntries = []string{"snapshots", audit.KeyFile, "servers", "agents"}

// uninstallCmd is `sandbox-mcp uninstall`: remove every sandbox container,
// network and image the project made, the state directory and the firewall
// table.
func uninstallCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("sandbox-mcp uninstall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", defaultStateDir(getenv), "state `dir`ectory to remove (snapshots, audit key)")
	keepState := fs.Bool("keep-state", false, "keep the state directory (snapshots)")
	force := fs.Bool("force", false, "remove running sandboxes too (they belong to a server that is still running)")
	dryRun := fs.Bool("dry-run", false, "say what would be removed, remove nothing")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: sandbox-mcp uninstall [flags]

Removes everything sandbox-mcp made on this machine: sandbox containers and
networks, the images (the default image, runtime and seed images, the test,
agent and server images: every image with an io.sandbox-mcp label), the state
directory (snapshots, the audit key, the sandbox records), and the nftables table inet
sandbox-mcp (needs root or CAP_NET_ADMIN). Stop every server first. The
binaries in bin/ and Kubernetes objects are not touched (make clean removes
bin/; kubectl delete namespace removes a cluster's).

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	sc := uninstallScope{stateDir: *stateDir, table: docker.FirewallTable, force: *force, dryRun: *dryRun}
	if *keepState {
		sc.stateDir = ""
	}
	cli, err := client.New(client.FromEnv)
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp uninstall: docker client: %v\n", err)
		return 1
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if err := uninstall(ctx, cli, sc, stdout); err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp uninstall: %v\n", err)
		return 1
	}
	return 0
}

// uninstall removes what sc covers, saying each thing it removes on w. It
// goes on past a failure and returns every one.
func uninstall(ctx context.Context, cli *client.Client, sc uninstallScope, w io.Writer) error {
	verb := "removed"
	if sc.dryRun {
		verb = "would remove"
	}
	var errs []error
	filters := func() client.Filters {
		f := make(client.Filters).Add("label", docker.LabelManaged+"=1")
		if sc.label != "" {
			f = f.Add("label", sc.label)
		}
		return f
	}

	// Containers first: they hold the networks and the images.
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: filters()})
	if err != nil {
		return fmt.Errorf("the Docker engine is not reachable (%v): start it, or set DOCKER_HOST", err)
	}
	if !sc.force && !sc.dryRun {
		var running []string
		for _, c := range cs.Items {
			if c.State == "running" {
				running = append(running, c.ID[:12]+" (sandbox "+c.Labels[docker.LabelSandbox]+")")
			}
		}
		if len(running) > 0 {
			return fmt.Errorf("%d sandbox container(s) are running, so a server is still using them: %s. Stop every sandbox-mcp server (close the clients that started it), or pass --force", len(running), strings.Join(running, ", "))
		}
	}
	for _, c := range cs.Items {
		if !sc.dryRun {
			if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("container %s: %w", c.ID[:12], err))
				continue
			}
		}
		fmt.Fprintf(w, "%s container %s (sandbox %s, %s)\n", verb, c.ID[:12], c.Labels[docker.LabelSandbox], c.State)
	}

	ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: filters()})
	if err != nil {
		errs = append(errs, fmt.Errorf("list networks: %w", err))
	}
	for _, n := range ns.Items {
		if !sc.dryRun {
			if _, err := cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("network %s: %w", n.Name, err))
				continue
			}
		}
		fmt.Fprintf(w, "%s network %s\n", verb, n.Name)
	}

	errs = append(errs, uninstallImages(ctx, cli, sc, verb, w)...)

	if sc.table != "" && !sc.dryRun {
		if existed, err := docker.RemoveFirewallTable(sc.table); errors.Is(err, os.ErrPermission) {
			// Only --network=allowlist makes the table, and it needs root
			// too: a user who never ran it as root has none to remove.
			fmt.Fprintf(w, "could not look for the nftables table inet %s (%v): if a server ran with --network=allowlist, run this again as root\n", sc.table, err)
		} else if err != nil {
			errs = append(errs, err)
		} else if existed {
			fmt.Fprintf(w, "removed nftables table inet %s\n", sc.table)
		}
	} else if sc.table != "" {
		fmt.Fprintf(w, "would remove nftables table inet %s, if it exists\n", sc.table)
	}

	if sc.stateDir != "" {
		errs = append(errs, uninstallState(sc.stateDir, sc.dryRun, verb, w)...)
	}
	return errors.Join(errs...)
}

// uninstallImages removes every image with a label of the project (and
// sc.label), children before the images they are built on: a pass removes
// what it can, and passes repeat while they make progress.
func uninstallImages(ctx context.Context, cli *client.Client, sc uninstallScope, verb string, w io.Writer) []error {
	list, err := cli.ImageList(ctx, client.ImageListOptions{})
	if err != nil {
		return []error{fmt.Errorf("list images: %w", err)}
	}
	key, val, _ := strings.Cut(sc.label, "=")
	var left []string
	names := map[string]string{}
	for _, im := range list.Items {
		ours := false
		for k := range im.Labels {
			if k == labelPrefix || strings.HasPrefix(k, labelPrefix+".") {
				ours = true
			}
		}
		if !ours || (sc.label != "" && im.Labels[key] != val) {
			continue
		}
		name := strings.TrimPrefix(im.ID, "sha256:")[:12]
		if len(im.RepoTags) > 0 {
			sort.Strings(im.RepoTags)
			name = strings.Join(im.RepoTags, ", ")
		}
		// An image built FROM one of ours inherits its labels: one the
		// operator named (e.g. a toolchain image, docs/image.md) is theirs.
		if tag := foreignTag(im.RepoTags); tag != "" {
			fmt.Fprintf(w, "kept image %s: it is built on a sandbox-mcp image but named by you; remove it with docker rmi if you no longer need it\n", tag)
			continue
		}
		left = append(left, im.ID)
		names[im.ID] = name
	}
	if sc.dryRun {
		for _, id := range left {
			fmt.Fprintf(w, "%s image %s\n", verb, names[id])
		}
		return nil
	}
	var last map[string]error
	for len(left) > 0 {
		var next []string
		last = map[string]error{}
		for _, id := range left {
			if _, err := cli.ImageRemove(ctx, id, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil && !cerrdefs.IsNotFound(err) {
				next = append(next, id)
				last[id] = err
				continue
			}
			fmt.Fprintf(w, "%s image %s\n", verb, names[id])
		}
		if len(next) == len(left) {
			break
		}
		left = next
	}
	var errs []error
	for _, id := range left {
		if err := last[id]; err != nil {
			errs = append(errs, fmt.Errorf("image %s: %w", names[id], err))
		}
	}
	return errs
}

// foreignTag returns a tag of tags whose repository is not one the project
// names its images with (sandbox-mcp, sandbox-mcp-runtime, -test, -agent,
// -server), or "".
func foreignTag(tags []string) string {
	for _, t := range tags {
		repo := t
		if i := strings.LastIndex(t, ":"); i > strings.LastIndex(t, "/") {
			repo = t[:i]
		}
		if repo != "sandbox-mcp" && !strings.HasPrefix(repo, "sandbox-mcp-") && !strings.HasSuffix(repo, "/sandbox-mcp") && !strings.Contains(repo, "/sandbox-mcp-") {
			return t
		}
	}
	return ""
}

// uninstallState removes what a server makes in dir, then dir if nothing
// else is in it; other files are named and kept (dir may be one the
// operator shares with other things).
func uninstallState(dir string, dryRun bool, verb string, w io.Writer) []error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return []error{fmt.Errorf("state directory: %w", err)}
	}
	var errs []error
	var kept []string
	for _, e := range ents {
		ours := strings.HasPrefix(e.Name(), ".audit.key-")
		for _, n := range stateEntries {
			ours = ours || e.Name() == n
		}
		if !ours {
			kept = append(kept, e.Name())
			continue
		}
		if !dryRun {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
				continue
			}
		}
	}
	if len(kept) > 0 {
		fmt.Fprintf(w, "%s sandbox-mcp's files from %s; kept what it did not make: %s\n", verb, dir, strings.Join(kept, ", "))
		return errs
	}
	if !dryRun {
		if err := os.Remove(dir); err != nil {
			return append(errs, err)
		}
	}
	fmt.Fprintf(w, "%s state directory %s\n", verb, dir)
	return errs
}
