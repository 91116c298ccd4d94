package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/workspace"
)

// seed is the content every new workspace starts with (--workspace-from):
// a tar stream of a host directory, made once at start.
type seed struct {
	dir   string
	f     *os.File // unlinked: it cannot outlive the server
	size  int64
	files int
	sha   string
}

// newSeed archives dir for seeding workspaces. The walk is the agent's own
// confined one, run here on the host: it starts from a descriptor of dir,
// never follows a symlink (symlinks are stored as symlinks), skips FIFOs,
// sockets and devices, and reads nothing outside dir. A file hard-linked
// from outside dir (whose content is not dir's to give) fails the whole
// seed, naming the file. The archive is capped at maxBytes.
func newSeed(dir string, maxBytes int64) (*seed, error) {
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
	return &seed{dir: dir, f: f, size: res.Bytes, files: res.Files, sha: hex.EncodeToString(h.Sum(nil))}, nil
}

// reader returns a reader of the whole archive; readers are independent.
func (s *seed) reader() io.Reader { return io.NewSectionReader(s.f, 0, s.size) }

func (s *seed) close() error { return s.f.Close() }

// seedInstance fills a new container's workspace from --workspace-from (a
// read-only workspace has it in its image already).
func (m *Manager) seedInstance(ctx context.Context, inst *instance) error {
	sd := m.seed
	if sd == nil || m.opts.Policy.ReadOnly {
		return nil
	}
	if _, err := inst.conn.Restore(ctx, sd.reader(), snapshotLimits(m.opts.Policy)); err != nil {
		return errcode.Errorf(errcode.Unavailable, "copying --workspace-from %s into the new sandbox failed (%v); retrying may help if the sandbox was busy", sd.dir, err)
	}
	return nil
}

// closeSeed closes sd, if any, and returns err: for the failures of
// NewManager after the seed was made.
func closeSeed(sd *seed, err error) error {
	if sd != nil {
		sd.close()
	}
	return err
}
