package agentproto

import (
	"fmt"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Hello is the agent's first frame.
type Hello struct {
	Version   int    `json:"version"`   // protocol version the agent speaks
	Agent     string `json:"agent"`     // agent build, for logs
	PID       int    `json:"pid"`       // the agent's pid inside the container
	UID       int    `json:"uid"`       // the effective uid its file operations run as
	Workspace string `json:"workspace"` // absolute path of the workspace root

	// The agent's real, effective and saved uids and gids, as the kernel
	// reports them: 0, the sandbox user's, 0. The server logs them.
	UIDs [3]int `json:"uids"`
	GIDs [3]int `json:"gids"`
	// CommandUID and CommandGID are the ids every command runs as.
	CommandUID int `json:"command_uid"`
	CommandGID int `json:"command_gid"`
	// CommandGroups is the first and the count of the supplementary group
	// ids the agent gives commands, one each.
	CommandGroups [2]uint32 `json:"command_groups"`
}

// Lease tells the agent how long to live without hearing from the server.
type Lease struct {
	// TTLMillis is the lease: with no frame from the server for this long,
	// the agent ends itself (and with it the container). 0 means no lease.
	TTLMillis int64 `json:"ttl_ms"`
}

// ExecRequest runs one program.
type ExecRequest struct {
	// Path is the absolute program to execute; Argv[0] is passed unchanged.
	// An empty Path means: resolve Argv[0] like ResolveRequest does.
	Path string   `json:"path,omitempty"`
	Argv []string `json:"argv"`
	// Cwd is workspace-relative ("." for the root) and confined like file
	// paths.
	Cwd string `json:"cwd"`
	// Env holds NAME=VALUE pairs added to the agent's base environment.
	Env []string `json:"env,omitempty"`
	// TimeoutMillis kills the command (and everything it started) after this
	// long. 0 means no limit.
	TimeoutMillis int64 `json:"timeout_ms"`
	// MaxOutput is the number of bytes per stream sent back; the rest is read
	// and dropped. 0 means nothing is sent.
	MaxOutput int64 `json:"max_output"`
	// Stdin is true when data frames with the command's stdin follow.
	// Otherwise stdin is empty.
	Stdin bool `json:"stdin,omitempty"`
}

// ExecResult ends an exec.
type ExecResult struct {
	ExitCode int `json:"exit_code"` // 128+signal when killed by a signal
	// Signal names the signal that ended the command, if any.
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Cancelled is true when a cancel frame stopped the command.
	Cancelled bool `json:"cancelled,omitempty"`
	// StdoutBytes and StderrBytes count everything the command wrote,
	// including what was dropped beyond MaxOutput.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// Killed counts the processes killed when the command timed out or was
	// cancelled.
	Killed       int   `json:"killed,omitempty"`
	DurationNano int64 `json:"duration_ns"`
}

// Duration returns the command's run time.
func (r ExecResult) Duration() time.Duration { return time.Duration(r.DurationNano) }

// ReadRequest reads part of a regular file.
type ReadRequest struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"`
	// Length is the number of bytes wanted; 0 means to the end of the file.
	Length int64 `json:"length"`
	// Max caps the bytes sent back.
	Max int64 `json:"max"`
}

// ReadResult ends a read. The content came in the data frames before it.
type ReadResult struct {
	Size      int64 `json:"size"` // size of the whole file
	Truncated bool  `json:"truncated"`
}

// WriteRequest writes a regular file from the data frames that follow.
type WriteRequest struct {
	Path   string `json:"path"`
	Append bool   `json:"append"`
	Mode   uint32 `json:"mode"` // permission bits for a new file
	// Size is the number of bytes that will follow. The agent refuses more.
	Size int64 `json:"size"`
}

// WriteResult ends a write.
type WriteResult struct {
	Written int64 `json:"written"`
	Size    int64 `json:"size"` // size of the file afterwards
}

// ListRequest lists a directory.
type ListRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
	Max       int    `json:"max"`
}

// Entry is one listed file. Its JSON lines travel in data frames.
type Entry struct {
	Path   string    `json:"path"` // workspace-relative, "/"-separated
	Type   string    `json:"type"` // file, dir, symlink or other
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits and setuid/setgid/sticky
	MTime  time.Time `json:"mtime"`
	Target string    `json:"target,omitempty"` // symlink target, as stored
}

// Entry types.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// ListResult ends a list.
type ListResult struct {
	Count     int  `json:"count"`
	Truncated bool `json:"truncated"`
}

// ResolveRequest resolves program names the way exec does: a name without a
// slash is looked up on the agent's fixed PATH; a name with a slash is taken
// relative to Cwd in the workspace. The result is cleaned, with symlinks in
// the directory part resolved and the last element kept, so that a busybox
// applet keeps its own name.
type ResolveRequest struct {
	Names []string `json:"names"`
	Cwd   string   `json:"cwd"`
}

// ResolveResult holds one path per name, "" where a name was not found.
type ResolveResult struct {
	Paths []string `json:"paths"`
}

// Limits bound a tar stream in either direction.
type Limits struct {
	MaxBytes   int64 `json:"max_bytes"`   // bytes of tar stream
	MaxEntries int   `json:"max_entries"` // headers
	MaxDepth   int   `json:"max_depth"`   // path components
}

// Workspace is where a sandbox's workspace is: the server mounts it there,
// and the agent serves it from there (unless SANDBOX_MCP_WORKSPACE names
// another directory). Paths in messages are relative to it.
const Workspace = "/workspace"

// The caps on a workspace tree carried as a tar stream, whichever way it
// goes (a snapshot out, a restore in, the seed of --workspace-from): at most
// MaxTreeEntries entries, at most MaxTreeDepth path components deep.
const (
	MaxTreeEntries = 1 << 20
	MaxTreeDepth   = 256
)

// TreeLimits returns the Limits of a workspace tree's tar stream of at most
// maxBytes.
func TreeLimits(maxBytes int64) Limits {
	return Limits{MaxBytes: maxBytes, MaxEntries: MaxTreeEntries, MaxDepth: MaxTreeDepth}
}

// SnapshotRequest asks for a tar stream of the whole workspace.
type SnapshotRequest struct {
	Limits
}

// SnapshotResult ends a snapshot.
type SnapshotResult struct {
	Files   int   `json:"files"`   // entries written
	Bytes   int64 `json:"bytes"`   // bytes of tar stream
	Skipped int   `json:"skipped"` // special files left out
}

// RestoreRequest replaces the workspace with the tar stream that follows.
type RestoreRequest struct {
	Limits
}

// RestoreResult ends a restore.
type RestoreResult struct {
	Files   int   `json:"files"`
	Bytes   int64 `json:"bytes"`
	Skipped int   `json:"skipped"` // entries dropped (devices, FIFOs, sockets)
}

// Error is the body of a KindError frame: the wire form of an
// *errcode.Error, or, with CodeInternal, of a fault that is not the model's to
// act on. Only the agent sends it; ErrorOf makes it and Err reads it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// CodeInternal is the wire code of a fault the model cannot act on. It is not
// one of errcode's codes, and Err never turns it into one.
const CodeInternal = "INTERNAL"

// ErrorOf is the wire form of err: the code and message of the *errcode.Error
// in its chain, or CodeInternal and err's text.
func ErrorOf(err error) Error {
	if e, ok := errcode.As(err); ok {
		return Error{Code: string(e.Code), Message: e.Message}
	}
	return Error{Code: CodeInternal, Message: err.Error()}
}

// agentMay reports whether the agent may answer with code: any of errcode's
// codes but POLICY_DENIED, which only the server's policy decides.
func agentMay(code errcode.Code) bool {
	return code.Valid() && code != errcode.PolicyDenied
}

// Err is the error e stands for, as the server reads it: an *errcode.Error
// when e.Code is a code the agent may send (any of errcode's but
// POLICY_DENIED). Any other code (CodeInternal, POLICY_DENIED, or one this
// server does not know) gives an error that is not an *errcode.Error, naming
// the code the agent sent: the model never sees it as one of its codes.
func (e Error) Err() error {
	if c := errcode.Code(e.Code); agentMay(c) {
		return &errcode.Error{Code: c, Message: e.Message}
	}
	return fmt.Errorf("agent: %s: %s", e.Code, e.Message)
}
