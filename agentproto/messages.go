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
	// Token, when set, lets a later server take over this agent: the
	// agent accepts a resync marker (ResyncMarker) only with it. The
	// server keeps it in its records, never anywhere the sandbox sees.
	// Empty means the agent ends at the first frame it cannot read, as
	// before version 5.
	Token string `json:"token,omitempty"`
}

// Resume is KindResume's body.
type Resume struct {
	// Nonce is echoed in the reply marker (ResyncReply), so that the
	// server knows where the agent's answer begins.
	Nonce string `json:"nonce"`
}

// Resumed is KindResumed's body: what a server taking over the agent
// needs to know of it.
type Resumed struct {
	Hello Hello `json:"hello"`
	// Jobs are the jobs the agent keeps, running or not.
	Jobs []JobStatus `json:"jobs"`
	// LeaseMillis is the lease the agent holds now (0: none).
	LeaseMillis int64 `json:"lease_ms"`
	// Detached and Cancelled count the old connection's requests the
	// agent turned into jobs (foreground execs) and stopped.
	Detached  int `json:"detached"`
	Cancelled int `json:"cancelled"`
}

// SetupRequest prepares the container before any command runs.
type SetupRequest struct {
	// CACerts is PEM certificates the sandbox's programs must trust besides
	// the image's roots: the egress proxy's CA, which signs the
	// certificates of the hosts whose requests it adds secrets to. Never a
	// key. The agent writes the image's roots and these to CABundlePath.
	CACerts string `json:"ca_certs"`
	// Env holds NAME=VALUE pairs added to the base environment of every
	// command the agent runs from now on (a later pair overrides an earlier
	// one and the agent's own environment). A backend whose instance
	// definition others can read (a pod spec, kept in etcd and shown by
	// `get pods`) delivers the sandbox's environment here instead: the
	// operator's --env values, the proxy URL with its credential, the
	// secrets' placeholders. A PATH among them is also where programs are
	// looked up. At most MaxSetupEnv bytes in all.
	Env []string `json:"env,omitempty"`
}

// MaxSetupEnv bounds SetupRequest.Env: the bytes of its pairs together.
const MaxSetupEnv = 512 << 10

// SetupResult ends a setup.
type SetupResult struct {
	// CABundle is the path of the bundle written ("" if CACerts was empty).
	CABundle string `json:"ca_bundle"`
	// SystemRoots is the image's root file the bundle starts with, "" if
	// the image has none (the bundle then holds only CACerts).
	SystemRoots string `json:"system_roots"`
	// Env is the number of SetupRequest.Env pairs the agent took (an agent
	// that predates Env answers 0, and the server refuses to go on).
	Env int `json:"env,omitempty"`
}

// CABundlePath is where the agent writes the CA bundle: under /tmp, a
// tmpfs that is writable with a read-only root filesystem, in a directory
// of its own. The server points SSL_CERT_FILE and the like at it.
const CABundlePath = "/tmp/.sandbox-mcp/ca-bundle.pem"

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

	// Job names the job the command runs as: an id the server picks, unique
	// on the connection, that JobRequest uses later. 0 keeps no job.
	Job uint64 `json:"job,omitempty"`
	// Label is how the job is listed (the command as the model wrote it).
	Label string `json:"label,omitempty"`
	// Background answers at once with KindResult and a JobStatus; the
	// output is only kept, never streamed. The command's stdin stays open
	// after the data frames, until a JobRequest closes it.
	Background bool `json:"background,omitempty"`
	// KeepOutput is the number of bytes per stream the agent keeps for
	// JobRequest reads, the oldest dropped first. 0 keeps nothing.
	KeepOutput int64 `json:"keep_output,omitempty"`
	// MaxJobs is the most jobs that may run at once: a request past it is
	// refused with BUSY. The agent also keeps at most MaxJobs ended jobs,
	// the oldest dropped first. 0 means no limit on running jobs and the
	// default number of ended jobs kept.
	MaxJobs int `json:"max_jobs,omitempty"`
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
	// PipesHeld is true when the command ended but a process (one it left
	// behind, or one that took its output) still held its stdout or stderr
	// when the agent stopped waiting: the counts are what was read by
	// then, and the job keeps what comes later.
	PipesHeld bool `json:"pipes_held,omitempty"`
	// OOMKills counts the processes the kernel killed for memory in the
	// sandbox's memory cgroup while the command ran (any of its processes,
	// or another's).
	OOMKills int64 `json:"oom_kills,omitempty"`
}

// Duration returns the command's run time.
func (r ExecResult) Duration() time.Duration { return time.Duration(r.DurationNano) }

// Job states.
const (
	JobRunning = "running" // the command's process has not ended
	JobExited  = "exited"  // it ended by itself with an exit code
	JobKilled  = "killed"  // a signal ended it
)

// JobRequest acts on a job and reads its output. The steps run in order:
// write Stdin, close stdin, send Signal, wait, read. The agent answers with
// stdout and stderr frames, then KindResult with a JobStatus.
type JobRequest struct {
	Job uint64 `json:"job"`
	// Stdin is written to the job's standard input; the agent waits a
	// bounded time for the command to take it.
	Stdin      []byte `json:"stdin,omitempty"`
	CloseStdin bool   `json:"close_stdin,omitempty"`
	// Signal is INT, TERM, HUP (sent to every process of the job) or KILL
	// (the job's whole tree is killed).
	Signal string `json:"signal,omitempty"`
	// WaitMillis waits up to this long for output past the read offsets, or
	// for the job to end. 0 does not wait. Once output came, the wait goes
	// on until it ends a line (in each stream that has new output), or for
	// a short quiet period, so that a line is not returned cut.
	WaitMillis int64 `json:"wait_ms,omitempty"`
	// StdoutOffset and StderrOffset are where each stream's read starts, in
	// bytes of everything the stream carried; -1 starts where the last
	// read of that stream (or the exec's live output) ended.
	StdoutOffset int64 `json:"stdout_offset"`
	StderrOffset int64 `json:"stderr_offset"`
	// Max bounds the bytes sent back, both streams together.
	Max int64 `json:"max"`
	// Peek leaves where the last read ended as it was (a read for
	// progress, which the model's next read must not skip).
	Peek bool `json:"peek,omitempty"`
}

// JobStatus is a job's state, the terminal body of a background exec, of a
// JobRequest and, in a list, of a JobsRequest.
type JobStatus struct {
	Job   uint64 `json:"job"`
	Label string `json:"label"`
	State string `json:"state"` // JobRunning, JobExited or JobKilled
	// ExitCode and Signal are as in ExecResult, once the job ended.
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// StartedUnixMilli is when the job started.
	StartedUnixMilli int64 `json:"started_unix_ms"`
	// StdoutFrom and StderrFrom are the offsets where the output sent with
	// this status begins (the request's offsets, moved up past dropped
	// bytes).
	StdoutFrom int64 `json:"stdout_from"`
	StderrFrom int64 `json:"stderr_from"`
	// StdoutBytes and StderrBytes count everything each stream carried.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// StdoutDropped and StderrDropped count the oldest bytes no longer
	// kept (past KeepOutput).
	StdoutDropped int64 `json:"stdout_dropped"`
	StderrDropped int64 `json:"stderr_dropped"`
	// Killed counts the processes killed by a KILL signal.
	Killed int `json:"killed,omitempty"`
	// OOMKills is as in ExecResult, once the job ended.
	OOMKills int64 `json:"oom_kills,omitempty"`
}

// JobsRequest lists the jobs the agent keeps. It has no fields; the agent
// answers with KindResult and a JobList.
type JobsRequest struct{}

// JobList holds the jobs the agent keeps, oldest first.
type JobList struct {
	Jobs []JobStatus `json:"jobs"`
}

// ReadRequest reads part of a regular file: a byte range (Offset, Length),
// or, when StartLine is set, a range of lines.
type ReadRequest struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"`
	// Length is the number of bytes wanted; 0 means to the end of the file.
	Length int64 `json:"length"`
	// Max caps the bytes sent back.
	Max int64 `json:"max"`
	// StartLine, if not 0, asks for lines StartLine to EndLine (1-based,
	// inclusive; EndLine 0 means to the end of the file) instead of a byte
	// range; Offset and Length must then be 0. Lines end with "\n".
	StartLine int64 `json:"start_line,omitempty"`
	EndLine   int64 `json:"end_line,omitempty"`
	// MaxScan bounds the bytes of the file a line read looks at, from the
	// file's first byte: lines are found and counted in them only, however
	// large the file says it is. 0 means no bound.
	MaxScan int64 `json:"max_scan,omitempty"`
	// MaxLineChars, if not 0, cuts every line of a line read that is
	// longer than this many characters (UTF-8 sequences; a byte that is not
	// one counts as one) to its first MaxLineChars, keeping its "\n"; the
	// result's Cuts say which lines lost what.
	MaxLineChars int64 `json:"max_line_chars,omitempty"`
}

// ReadResult ends a read. The content came in the data frames before it.
type ReadResult struct {
	Size      int64 `json:"size"` // size of the whole file
	Truncated bool  `json:"truncated"`
	// Offset is the byte of the file the content starts at (a line read's
	// first line; a byte read's Offset).
	Offset int64 `json:"offset,omitempty"`
	// End is the byte of the file after the content's last byte: where a
	// read by bytes goes on (a line read's content is not one run of the
	// file's bytes when lines were cut).
	End int64 `json:"end,omitempty"`
	// For a line read: the first and the last line in the content (the
	// last may be cut, when Max stopped inside it), and the number of lines
	// in the bytes scanned.
	StartLine  int64 `json:"start_line,omitempty"`
	EndLine    int64 `json:"end_line,omitempty"`
	TotalLines int64 `json:"total_lines,omitempty"`
	// Scanned is, for a line read, the bytes of the file looked at: the
	// whole file, or MaxScan of it. TotalLines counts the lines in them.
	Scanned int64 `json:"scanned,omitempty"`
	// Cuts are the lines MaxLineChars cut, in order; at most one per
	// MaxLineChars bytes of content, and one more.
	Cuts []LineCut `json:"cuts,omitempty"`
}

// LineCut is a line a line read cut short.
type LineCut struct {
	Line int64 `json:"line"`
	// Offset is the byte of the file where the part left out starts.
	Offset int64 `json:"offset"`
	// Rest is the bytes of the line left out, its "\n" not counted. A
	// line that goes on past the bytes scanned counts only those.
	Rest int64 `json:"rest"`
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

// EditRequest replaces text in a regular file. The data frames that follow
// carry OldSize bytes of the text to find, then NewSize bytes of its
// replacement, then eof.
type EditRequest struct {
	Path       string `json:"path"`
	OldSize    int64  `json:"old_size"`
	NewSize    int64  `json:"new_size"`
	ReplaceAll bool   `json:"replace_all"`
	// MaxFile is the largest file the edit reads or leaves behind.
	MaxFile int64 `json:"max_file"`
	// Edits, when set, are several replacements applied in order, each to
	// the text the ones before it left, all or nothing: the file changes
	// only if every one applies. The data frames carry each one's old text
	// then its new text, in order. OldSize, NewSize and ReplaceAll are then
	// 0.
	Edits []EditSpec `json:"edits,omitempty"`
}

// MaxEdits is the most replacements one EditRequest may carry.
const MaxEdits = 100

// EditSpec is one replacement of an EditRequest with several.
type EditSpec struct {
	OldSize    int64 `json:"old_size"`
	NewSize    int64 `json:"new_size"`
	ReplaceAll bool  `json:"replace_all"`
}

// EditResult ends an edit.
type EditResult struct {
	Replacements int   `json:"replacements"`
	Size         int64 `json:"size"`    // size of the file afterwards
	Created      bool  `json:"created"` // the file did not exist (empty old text)
}

// DeleteRequest removes a file, a symlink (not its target) or a directory.
type DeleteRequest struct {
	Path string `json:"path"`
	// Recursive is needed to remove a directory that is not empty.
	Recursive bool `json:"recursive"`
}

// DeleteResult ends a delete.
type DeleteResult struct {
	Deleted int64  `json:"deleted"` // entries removed, the path itself included
	Type    string `json:"type"`    // what the path was: file, dir, symlink or other
}

// MoveRequest renames From to To inside the workspace.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Overwrite lets the move replace an existing To.
	Overwrite bool `json:"overwrite"`
}

// MoveResult ends a move.
type MoveResult struct {
	To   string `json:"to"`   // the destination, normalised (a To ending in "/" gets From's name)
	Type string `json:"type"` // what was moved: file, dir, symlink or other
}

// ListRequest lists a directory. A recursive list goes breadth-first: the
// directory's entries, then those of its subdirectories, a level at a time,
// sorted by name within each directory.
type ListRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
	Max       int    `json:"max"`
	// Pattern, if set, is a glob (see workspace.MatchGlob) an entry's
	// workspace-relative path must match to be sent; directories that do
	// not match are still walked.
	Pattern string `json:"pattern,omitempty"`
	// Prune names directories a recursive list does not enter below its
	// start (dependency trees, version control): each is sent as one
	// entry with Pruned set and Count.
	Prune []string `json:"prune,omitempty"`
	// MaxScan bounds the directory entries the list looks at, sent or
	// not; past it the list ends, truncated. 0 means no bound.
	MaxScan int `json:"max_scan,omitempty"`
}

// Entry is one listed file. Its JSON lines travel in data frames.
type Entry struct {
	Path   string    `json:"path"` // workspace-relative, "/"-separated
	Type   string    `json:"type"` // file, dir, symlink or other
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits and setuid/setgid/sticky
	MTime  time.Time `json:"mtime"`
	Target string    `json:"target,omitempty"` // symlink target, as stored
	// Pruned marks a directory listed but not entered (ListRequest.Prune);
	// Count is then the number of entries directly in it.
	Pruned bool  `json:"pruned,omitempty"`
	Count  int64 `json:"count,omitempty"`
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
	// Scanned is the directory entries looked at; it reaches MaxScan when
	// that bound ended the list.
	Scanned int `json:"scanned,omitempty"`
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

// PortOpenRequest opens a byte stream to a TCP port inside the sandbox.
type PortOpenRequest struct {
	// Port is the port on 127.0.0.1 in the sandbox's network namespace,
	// 1 to 65535.
	Port int `json:"port"`
	// DialTimeoutMillis bounds the connect; 0 means the agent's default
	// (5 s).
	DialTimeoutMillis int64 `json:"dial_timeout_ms"`
}

// PortAck acknowledges port stream bytes (see KindPortAck).
type PortAck struct {
	Bytes int64 `json:"bytes"`
}

// PortResult ends a port stream.
type PortResult struct {
	// ToPort and FromPort count the bytes written to and read from the
	// socket.
	ToPort   int64 `json:"to_port"`
	FromPort int64 `json:"from_port"`
	// Reset is true when the stream ended by a cancel or a socket error,
	// not by both sides closing.
	Reset bool `json:"reset,omitempty"`
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
