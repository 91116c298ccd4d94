package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/workspace"
)

// Seed is the content every new workspace starts with (--workspace-from):
// a tar stream of a host directory, read once at start by LoadSeed, which
// gives it to whichever backend runs the sandboxes.
type Seed struct {
	dir      string
	f        *os.File // unlinked: it cannot outlive the server
	size     int64
	files    int
	sha      string
	readOnly bool // given to the backend for a read-only workspace
}

// LoadSeed archives dir for seeding workspaces, once, for whichever backend
// runs the sandboxes. A writable workspace gets a copy of it at each start
// (the Manager's, from Options.Seed); a read-only one cannot be filled
// after the start, so with readOnly the content goes to be, which puts it
// into what its instances run (backend.ReadOnlySeed), and a backend that
// cannot is refused here rather than given sandboxes whose workspace is
// silently empty.
//
// The walk is the agent's own confined one, run here on the host: it
// starts from a descriptor of dir, never follows a symlink (symlinks are
// stored as symlinks), skips FIFOs, sockets and devices, and reads nothing
// outside dir. A file hard-linked from outside dir (whose content is not
// dir's to give) fails the whole seed, naming the file. The archive is
// capped at maxBytes. The Seed goes to Options.Seed, whose Manager closes
// it; Close it if no Manager is made.
func LoadSeed(dir string, maxBytes int64, readOnly bool, be backend.Backend) (*Seed, error) {
	var rs backend.ReadOnlySeed
	if readOnly {
		var ok bool
		if rs, ok = be.(backend.ReadOnlySeed); !ok {
			return nil, errors.New("session: a read-only workspace cannot start with content (--workspace-from) on this backend: it cannot put the content into what its instances run")
		}
	}
	ws, err := workspace.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("--workspace-from %s: %w", dir, err)
	}
	defer ws.Close()
	f, err := os.CreateTemp("", "sandbox-mcp-seed-*.tar")
	if err != nil {
		return nil, fmt.Errorf("--workspace-from: %w", err)
	}
	os.Remove(f.Name())
	h := sha256.New()
	res, err := ws.SnapshotTree(io.MultiWriter(f, h), agentproto.TreeLimits(maxBytes),
		workspace.SnapshotOptions{OwnLinksOnly: true})
	if err != nil {
		f.Close()
		if e, ok := errcode.As(err); ok && e.Code == errcode.TooLarge {
			return nil, fmt.Errorf("--workspace-from %s is larger than the workspace (--max-workspace-bytes %d): %s", dir, maxBytes, e.Message)
		}
		if e, ok := errcode.As(err); ok {
			return nil, fmt.Errorf("--workspace-from %s: %s", dir, e.Message)
		}
		return nil, fmt.Errorf("--workspace-from %s: %w", dir, err)
	}
	sd := &Seed{dir: dir, f: f, size: res.Bytes, files: res.Files, sha: hex.EncodeToString(h.Sum(nil)), readOnly: readOnly}
	if rs != nil {
		rs.SeedReadOnly(sd.sha, sd.reader)
	}
	return sd, nil
}

// reader returns a reader of the whole archive; readers are independent.
func (s *Seed) reader() io.Reader { return io.NewSectionReader(s.f, 0, s.size) }

// Close releases the archive.
func (s *Seed) Close() error { return s.f.Close() }

// seedInstance fills a new container's workspace from its template's
// --workspace-from (a read-only workspace has it in its image already).
func (m *Manager) seedInstance(ctx context.Context, inst *instance, tpl *Template) error {
	sd := tpl.Seed
	if sd == nil || tpl.Policy.ReadOnly {
		return nil
	}
	if _, err := inst.conn.Restore(ctx, sd.reader(), snapshotLimits(tpl.Policy)); err != nil {
		return errcode.Errorf(errcode.Unavailable, "copying --workspace-from %s into the new sandbox failed (%v); retrying may help if the sandbox was busy", sd.dir, err)
	}
	return nil
}

// closeSeed closes sd, if any, and returns err: for the failures of
// NewManager after the seed was made.
func closeSeed(sd *Seed, err error) error {
	if sd != nil {
		sd.Close()
	}
	return err
}
