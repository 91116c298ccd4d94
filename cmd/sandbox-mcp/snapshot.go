package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/agent"
	"github.com/sandbox-mcp/sandbox-mcp/session/agentproto"
)

const snapshotUsage = `Usage:
  sandbox-mcp snapshot list [flags]              list the snapshots in --state-dir
  sandbox-mcp snapshot export [flags] ID DIR     write a snapshot's files into DIR (new or empty)
  sandbox-mcp snapshot rm [flags] ID...          delete snapshots

Flags are the server's (--state-dir, --config, ...); see sandbox-mcp -h.
`

// snapshotCmd manages the snapshots in the state directory, with no engine
// and no server needed.
func snapshotCmd(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, snapshotUsage)
		return 0
	}
	verb := args[0]
	cfg, rest, err := parseConfig(args[1:], getenv)
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp snapshot: %v\n", err)
		return 2
	}
	// Open without pruning: listing or exporting must not delete anything.
	store, err := session.OpenSnapshotStore(filepath.Join(cfg.StateDir, "snapshots"), session.Retention{})
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp snapshot: %v\n", err)
		return 1
	}
	switch verb {
	case "list", "ls":
		all, err := store.List()
		if err != nil {
			fmt.Fprintf(stderr, "sandbox-mcp snapshot list: %v\n", err)
			return 1
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCREATED\tSIZE\tFILES\tSANDBOX\tLABEL")
		for _, in := range all {
			// Records are the callers' (labels) and could be tampered
			// with (ids): nothing in them reaches the terminal raw.
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", termSafe(in.ID), in.CreatedAt.Local().Format(time.DateTime), in.SizeBytes, in.Files, termSafe(in.Sandbox), termSafe(in.Label))
		}
		tw.Flush()
		return 0
	case "export":
		if len(rest) != 2 {
			fmt.Fprint(stderr, snapshotUsage)
			return 2
		}
		res, err := exportSnapshot(store, rest[0], rest[1])
		if err != nil {
			fmt.Fprintf(stderr, "sandbox-mcp snapshot export: %s\n", termSafe(err.Error()))
			return 1
		}
		fmt.Fprintf(stdout, "exported %s to %s: %d entries, %d skipped\n", termSafe(rest[0]), termSafe(rest[1]), res.Files, res.Skipped)
		return 0
	case "rm", "delete":
		if len(rest) == 0 {
			fmt.Fprint(stderr, snapshotUsage)
			return 2
		}
		code := 0
		for _, id := range rest {
			if err := store.Delete(id); err != nil {
				fmt.Fprintf(stderr, "sandbox-mcp snapshot rm %s: %v\n", termSafe(id), err)
				code = 1
				continue
			}
			fmt.Fprintf(stdout, "deleted %s\n", termSafe(id))
		}
		return code
	}
	fmt.Fprintf(stderr, "sandbox-mcp snapshot: unknown command %q\n%s", verb, snapshotUsage)
	return 2
}

// exportSnapshot writes a snapshot's files into dir, which must be new or
// empty. The archive is unpacked with the agent's confined extraction,
// rooted at a descriptor of dir: an entry with "..", an absolute name, a
// link that leads out or a symlink in a parent is refused, devices are
// skipped and setuid bits dropped, so nothing is ever written outside dir.
func exportSnapshot(store *session.SnapshotStore, id, dir string) (agentproto.RestoreResult, error) {
	var res agentproto.RestoreResult
	info, f, err := store.Open(id)
	if err != nil {
		if errors.Is(err, session.ErrSnapshotNotFound) {
			return res, fmt.Errorf("no snapshot %q in %s; `sandbox-mcp snapshot list` shows them", id, store.Dir())
		}
		return res, err
	}
	defer f.Close()
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return res, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return res, err
	}
	if len(entries) > 0 {
		return res, fmt.Errorf("%s is not empty; export into a new or empty directory", dir)
	}
	ws, err := agent.OpenWorkspace(dir)
	if err != nil {
		return res, err
	}
	defer ws.Close()
	return ws.Restore(f, agentproto.Limits{MaxBytes: info.SizeBytes + 1<<20, MaxEntries: 1 << 22, MaxDepth: 4096})
}
