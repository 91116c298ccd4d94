// Package snapshotcli is `sandbox-mcp snapshot`: the operator's commands
// for the snapshots in the state directory (list, export, rm). It needs no
// engine and no server running, and links neither: only the snapshot store
// and the confined extraction of package workspace.
package snapshotcli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
	"github.com/sandbox-mcp/sandbox-mcp/workspace"
)

const snapshotUsage = `Usage:
  sandbox-mcp snapshot list [flags]              list the snapshots in --state-dir
  sandbox-mcp snapshot export [flags] ID DIR     write a snapshot's files into DIR (new or empty)
  sandbox-mcp snapshot rm [flags] ID...          delete snapshots

Flags are the server's (--state-dir, --config, ...); see sandbox-mcp -h.
export also takes:
  --symlinks=inside      write only symlinks that lead to a place inside DIR,
                         and name the others on stderr (the default)
  --symlinks=keep        write every symlink as the archive has it
  --allow-group-write    keep group and other write permission from the
                         archive (the umask still applies; by default they
                         are dropped)
`

// maxExportNotes is how many skipped symlinks export names on stderr; the
// rest are counted.
const maxExportNotes = 20

// exportOptions are export's own flags.
type exportOptions struct {
	keepSymlinks    bool // --symlinks=keep
	allowGroupWrite bool // --allow-group-write
}

// takeExportFlags removes export's own flags from args, wherever they are,
// and returns the rest for the server's flag parser.
func takeExportFlags(args []string) (exportOptions, []string, error) {
	var opt exportOptions
	var rest []string
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") {
			name = ""
		}
		switch name {
		case "symlinks":
			if !hasVal {
				if i+1 == len(args) {
					return opt, nil, errors.New("--symlinks needs a value: inside or keep")
				}
				i++
				val = args[i]
			}
			switch val {
			case "inside":
				opt.keepSymlinks = false
			case "keep":
				opt.keepSymlinks = true
			default:
				return opt, nil, fmt.Errorf("--symlinks=%s: use inside (the default: only symlinks that lead inside DIR) or keep (every symlink as archived)", termSafe(val))
			}
		case "allow-group-write":
			b, err := strconv.ParseBool(cmp.Or(val, "true"))
			if err != nil {
				return opt, nil, fmt.Errorf("--allow-group-write=%s: use true or false", termSafe(val))
			}
			opt.allowGroupWrite = b
		default:
			rest = append(rest, args[i])
		}
	}
	return opt, rest, nil
}

// ParseFunc parses the server's flags (--state-dir, --config, ...) from
// args and returns the state directory and the arguments left.
type ParseFunc func(args []string) (stateDir string, rest []string, err error)

// Run runs `sandbox-mcp snapshot` with args (the verb first) and returns
// the exit code.
func Run(args []string, stdout, stderr io.Writer, parse ParseFunc) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, snapshotUsage)
		return 0
	}
	verb := args[0]
	args = args[1:]
	var opt exportOptions
	if verb == "export" {
		var err error
		if opt, args, err = takeExportFlags(args); err != nil {
			fmt.Fprintf(stderr, "sandbox-mcp snapshot export: %v\n", err)
			return 2
		}
	}
	stateDir, rest, err := parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp snapshot: %v\n", err)
		return 2
	}
	// Open without pruning: listing or exporting must not delete anything.
	store, err := snapshot.OpenStore(filepath.Join(stateDir, "snapshots"), snapshot.Retention{})
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
		res, err := exportSnapshot(store, rest[0], rest[1], opt, stderr)
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
// hard link that leads out or a symlink in a parent is refused, devices are
// skipped and setuid, setgid and sticky bits dropped, so nothing is ever
// written outside dir. Modes are masked with the umask and, unless
// allowGroupWrite, lose group and other write. Unless keepSymlinks, a
// symlink that would lead outside dir (see workspace.SymlinkStaysInside) is
// not written, and named on stderr.
func exportSnapshot(store *snapshot.Store, id, dir string, opt exportOptions, stderr io.Writer) (agentproto.RestoreResult, error) {
	var res agentproto.RestoreResult
	info, f, err := store.Open(id)
	if err != nil {
		if errors.Is(err, snapshot.ErrNotFound) {
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
	ws, err := workspace.Open(dir)
	if err != nil {
		return res, err
	}
	defer ws.Close()
	umask := syscall.Umask(0)
	syscall.Umask(umask)
	xo := workspace.ExtractOptions{ClearMode: uint32(umask)}
	if !opt.allowGroupWrite {
		xo.ClearMode |= 0o022
	}
	skipped := 0
	if !opt.keepSymlinks {
		xo.KeepSymlink = func(name, target string) bool {
			if workspace.SymlinkStaysInside(name, target) {
				return true
			}
			if skipped++; skipped <= maxExportNotes {
				fmt.Fprintf(stderr, "sandbox-mcp snapshot export: skipped the symlink %s -> %s: it leads outside %s (--symlinks=keep writes it)\n",
					termSafe(name), termSafe(target), termSafe(dir))
			}
			return false
		}
	}
	res, err = ws.Extract(f, agentproto.Limits{MaxBytes: info.SizeBytes + 1<<20, MaxEntries: 1 << 22, MaxDepth: 4096}, xo)
	if skipped > maxExportNotes {
		fmt.Fprintf(stderr, "sandbox-mcp snapshot export: and %d more symlinks that lead outside %s\n", skipped-maxExportNotes, termSafe(dir))
	}
	return res, err
}
