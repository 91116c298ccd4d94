package policy

import (
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Workspace is the absolute path of every sandbox's workspace. The agent's
// protocol names the same path (agentproto.Workspace; a test checks they
// agree): policy is pure and imports no wire package.
const Workspace = "/workspace"

// MaxArgv is the most argv items sandbox_exec takes.
const MaxArgv = 64

// Size caps of a command's arguments and environment, counted the way the
// kernel counts them: each string with its terminating NUL, an env entry as
// NAME=VALUE. Both are far below what Linux takes (128 KiB per string,
// about 2 MiB in all); the agent's protocol is sized to carry both at their
// caps with every byte escaped. Larger input goes on stdin or in a file.
const (
	MaxArgvBytes = 64 << 10
	MaxEnvBytes  = 64 << 10
)

// largeInputHint is what to do with input too large for argv or env.
const largeInputHint = "pass large input on stdin, or write it to a file with sandbox_write_file and have the command read it"

// CanExec decides whether commands may run at all.
func (p Policy) CanExec() Decision {
	if p.Exec == ExecDeny {
		return Deny(errcode.PolicyDenied, "this server does not run commands (--exec=deny); use sandbox_read_file, sandbox_write_file and sandbox_list instead")
	}
	return Allowed
}

// NeedsResolve reports whether exec decisions need argv[0] resolved to a
// program path first (see CheckProgram).
func (p Policy) NeedsResolve() bool { return p.Exec == ExecAllowlist }

// CheckProgram decides whether a command may run under the allowlist.
// resolved is what argv0 resolves to inside the sandbox ("" if nothing);
// allowed maps each resolved allowlist entry to the entry as the operator
// wrote it. The decision is made on the resolved program, never on the
// spelling: "/usr/bin/../bin/sh" or "./ls" are not "ls".
func (p Policy) CheckProgram(argv0, resolved string, allowed map[string]string) Decision {
	if d := p.CanExec(); !d.Allow {
		return d
	}
	if p.Exec != ExecAllowlist {
		return Allowed
	}
	if resolved != "" {
		if _, ok := allowed[resolved]; ok {
			return Allowed
		}
	}
	list := strings.Join(p.AllowCmds, ", ")
	switch {
	case resolved == "":
		return Deny(errcode.PolicyDenied, "%q is not on this server's command allowlist (allowed: %s)", argv0, list)
	case resolved == argv0 || path.Base(resolved) == argv0:
		return Deny(errcode.PolicyDenied, "%q (%s) is not on this server's command allowlist (allowed: %s)", argv0, resolved, list)
	default:
		return Deny(errcode.PolicyDenied, "%q resolves to %s, which is not on this server's command allowlist (allowed: %s); call an allowed command by its name", argv0, resolved, list)
	}
}

// CheckArgv validates sandbox_exec's argv: 1 to MaxArgv items, no NUL, a
// non-empty program name of at most MaxPathBytes, and at most MaxArgvBytes
// in all.
func CheckArgv(argv []string) Decision {
	if len(argv) == 0 {
		return Deny(errcode.InvalidArgument, "argv is empty; pass the program and its arguments, e.g. [\"ls\", \"-l\"]")
	}
	if len(argv) > MaxArgv {
		return Deny(errcode.InvalidArgument, "argv has %d items; at most %d are allowed (write a script with sandbox_write_file and run that)", len(argv), MaxArgv)
	}
	if argv[0] == "" {
		return Deny(errcode.InvalidArgument, "argv[0] is empty; it names the program to run")
	}
	if len(argv[0]) > MaxPathBytes {
		return Deny(errcode.InvalidArgument, "argv[0] is %d bytes long; a program name or path has at most %d", len(argv[0]), MaxPathBytes)
	}
	size := 0
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return Deny(errcode.InvalidArgument, "argv[%d] contains a NUL byte, which no program can receive", i)
		}
		size += len(a) + 1
	}
	if size > MaxArgvBytes {
		return Deny(errcode.TooLarge, "argv is %d bytes (each item counted with its terminating NUL); at most %d are allowed: %s", size, MaxArgvBytes, largeInputHint)
	}
	return Allowed
}

// EnvNamePattern is what an environment variable's name must match, in a
// tool call's env and in the server's --env: a letter or underscore, then
// letters, digits and underscores.
const EnvNamePattern = `^[A-Za-z_][A-Za-z0-9_]*$`

var envName = regexp.MustCompile(EnvNamePattern)

// ValidEnvName reports whether name matches EnvNamePattern.
func ValidEnvName(name string) bool { return envName.MatchString(name) }

// CheckEnv validates sandbox_exec's env, at most MaxEnvBytes in all, and
// returns it as sorted NAME=VALUE pairs.
func CheckEnv(env map[string]string) ([]string, Decision) {
	out := make([]string, 0, len(env))
	size := 0
	for k, v := range env {
		if !envName.MatchString(k) {
			return nil, Deny(errcode.InvalidArgument, "env name %q is not valid; names match [A-Za-z_][A-Za-z0-9_]*", clip(k))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, Deny(errcode.InvalidArgument, "env %s contains a NUL byte", clip(k))
		}
		size += len(k) + 1 + len(v) + 1
		out = append(out, k+"="+v)
	}
	if size > MaxEnvBytes {
		return nil, Deny(errcode.TooLarge, "env is %d bytes (each variable counted as NAME=VALUE with a terminating NUL); at most %d are allowed: %s", size, MaxEnvBytes, largeInputHint)
	}
	slices.Sort(out)
	return out, Allowed
}

// clip shortens a caller's string for quoting in a reason.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// ExecTimeoutFor turns sandbox_exec's timeout_ms into a duration: 0 means the
// default; above the ceiling is refused.
func (p Policy) ExecTimeoutFor(ms int64) (time.Duration, Decision) {
	if ms < 0 {
		return 0, Deny(errcode.InvalidArgument, "timeout_ms must not be negative")
	}
	if ms == 0 {
		return p.ExecTimeout, Allowed
	}
	d := time.Duration(ms) * time.Millisecond
	if d > p.MaxExecTimeout {
		return 0, Deny(errcode.PolicyDenied, "timeout_ms %d is above this server's ceiling of %d (--max-exec-timeout); use at most %d, or run the work in the background and poll",
			ms, p.MaxExecTimeout.Milliseconds(), p.MaxExecTimeout.Milliseconds())
	}
	return d, Allowed
}

// WorkspacePath turns a tool's path argument into a workspace-relative path
// ("." for the root). An absolute path under /workspace is the same as the
// relative one; any other absolute path, and any path whose ".." climbs out,
// is OUTSIDE_WORKSPACE. This is a first, lexical check that gives a clear
// error early; the agent's confined walk inside the container is what
// enforces confinement (it also sees symlinks).
func WorkspacePath(p string) (string, Decision) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", Deny(errcode.InvalidArgument, "path contains a NUL byte")
	}
	if len(p) > MaxPathBytes {
		return "", Deny(errcode.InvalidArgument, "path is %d bytes long; at most %d are allowed", len(p), MaxPathBytes)
	}
	if !utf8.ValidString(p) {
		return "", Deny(errcode.InvalidArgument, "path is not valid UTF-8")
	}
	if strings.HasPrefix(p, "~") {
		// A model's habit from its own machine: nothing expands ~ here.
		return "", Deny(errcode.InvalidArgument, "%q starts with ~, which nothing expands here: the workspace is %s; give paths relative to it (src/main.py) or absolute under it (%s/src/main.py)", p, Workspace, Workspace)
	}
	rel := p
	if strings.HasPrefix(p, "/") {
		c := path.Clean(p)
		switch {
		case c == Workspace:
			rel = "."
		case strings.HasPrefix(p, Workspace+"/") && strings.HasPrefix(c, Workspace+"/"):
			rel = strings.TrimLeft(strings.TrimPrefix(p, Workspace), "/")
		default:
			return "", Deny(errcode.OutsideWorkspace, "%q is outside the workspace; paths are relative to %s (an absolute path must start with %s/)", p, Workspace, Workspace)
		}
	}
	if rel == "" {
		rel = "."
	}
	if c := path.Clean(rel); c == ".." || strings.HasPrefix(c, "../") {
		return "", Deny(errcode.OutsideWorkspace, "%q climbs out of the workspace with \"..\"; paths are relative to %s", p, Workspace)
	}
	return rel, Allowed
}

// DefaultFileMode is the mode of a file sandbox_write_file creates.
const DefaultFileMode = 0o644

// ParseMode parses sandbox_write_file's mode: an octal string of permission
// bits such as "0644" or "755". "" means DefaultFileMode.
func ParseMode(s string) (uint32, Decision) {
	if s == "" {
		return DefaultFileMode, Allowed
	}
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0")
	if t == "" {
		t = "0"
	}
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || len(s) > 5 {
		return 0, Deny(errcode.InvalidArgument, "mode %q is not an octal permission string such as \"0644\" or \"0755\"", s)
	}
	if v > 0o777 {
		return 0, Deny(errcode.InvalidArgument, "mode %q has bits beyond permissions (setuid, setgid, sticky are not allowed); use 0000 to 0777", s)
	}
	return uint32(v), Allowed
}

// CanWrite decides whether a tool may change the workspace.
func (p Policy) CanWrite() Decision {
	if p.ReadOnly {
		return Deny(errcode.ReadOnly, "the workspace is read-only on this server (--read-only); nothing can be written or changed")
	}
	return Allowed
}

// CheckWriteSize decides whether n bytes may be written in one call.
func (p Policy) CheckWriteSize(n int64) Decision {
	if n > p.MaxFileBytes {
		return Deny(errcode.TooLarge, "content is %d bytes; this server writes at most %d bytes per call (--max-file-bytes); write it in parts with append", n, p.MaxFileBytes)
	}
	return Allowed
}

// ListEntries turns sandbox_list's max_entries into a count (0 means the
// default).
func ListEntries(n int) (int, Decision) {
	switch {
	case n < 0:
		return 0, Deny(errcode.InvalidArgument, "max_entries must not be negative")
	case n == 0:
		return DefaultListEntries, Allowed
	case n > MaxListEntries:
		return 0, Deny(errcode.InvalidArgument, "max_entries %d is above %d; list a subdirectory instead", n, MaxListEntries)
	}
	return n, Allowed
}

// CheckReadRange validates sandbox_read_file's range and reports whether it
// is one of bytes: lines (offset, the first, 1-based; limit, how many) or
// bytes (byte_offset, byte_length), never both; nothing negative.
func CheckReadRange(offset, limit, byteOffset, byteLength int64) (bool, Decision) {
	switch {
	case offset < 0 || limit < 0 || byteOffset < 0 || byteLength < 0:
		return false, Deny(errcode.InvalidArgument, "offset, limit, byte_offset and byte_length must not be negative (offset is a line number, from 1)")
	case (offset > 0 || limit > 0) && (byteOffset > 0 || byteLength > 0):
		return false, Deny(errcode.InvalidArgument, "give lines (offset, the first line from 1, and limit, how many) or bytes (byte_offset and byte_length), not both")
	}
	return byteOffset > 0 || byteLength > 0, Allowed
}

// CheckPattern validates sandbox_list's pattern: a glob of "/"-separated
// elements, each as path.Match reads it, or "**".
func CheckPattern(pattern string) Decision {
	if len(pattern) > MaxPatternBytes {
		return Deny(errcode.InvalidArgument, "pattern is %d bytes; give at most %d", len(pattern), MaxPatternBytes)
	}
	for _, el := range strings.Split(pattern, "/") {
		if _, err := path.Match(el, ""); err != nil {
			return Deny(errcode.InvalidArgument, "pattern %q is malformed (an unclosed [ or a trailing \\); use * and ? within a name, ** for any number of directories, e.g. **/*.py", clip(pattern))
		}
	}
	return Allowed
}

// MaxEdits is the most edits one sandbox_edit_file call takes: as many as
// one agentproto.EditRequest may carry (a test checks they agree).
const MaxEdits = 100

// CheckEdits decides whether n edits whose strings take total bytes may be
// sent in one sandbox_edit_file call: at most MaxEdits of them, and their
// strings together at most twice the file cap (the most one edit's two
// strings take).
func (p Policy) CheckEdits(n int, total int64) Decision {
	switch {
	case n > MaxEdits:
		return Deny(errcode.InvalidArgument, "%d edits; give at most %d in one call, and the rest in another", n, MaxEdits)
	case total > 2*p.MaxFileBytes:
		return Deny(errcode.TooLarge, "the edits' strings take %d bytes together; one call takes at most %d (twice --max-file-bytes); edit in smaller steps", total, 2*p.MaxFileBytes)
	}
	return Allowed
}

// CheckEdit decides whether sandbox_edit_file's strings may be sent: they
// must differ (an edit that changes nothing is a mistake to point out), and
// each is at most the file cap (the file before and after is held to it
// too, where the file is).
func (p Policy) CheckEdit(oldString, newString string) Decision {
	if oldString == newString {
		return Deny(errcode.InvalidArgument, "old_string and new_string are the same, so the edit would change nothing; give the new text in new_string")
	}
	if n := max(len(oldString), len(newString)); int64(n) > p.MaxFileBytes {
		return Deny(errcode.TooLarge, "old_string or new_string is %d bytes; this server edits files of at most %d bytes (--max-file-bytes); make the change in smaller steps", n, p.MaxFileBytes)
	}
	return Allowed
}

// CheckRenamable decides whether a workspace path (as WorkspacePath gives
// it) may be deleted or moved: anything but the workspace root.
func CheckRenamable(rel string) Decision {
	if path.Clean(rel) == "." {
		return Deny(errcode.InvalidArgument, "%q names the workspace root, which cannot be deleted or moved; name a file or directory inside it", rel)
	}
	return Allowed
}
