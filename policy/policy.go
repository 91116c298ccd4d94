// Package policy holds the operator's rules for what a sandbox may do, and
// the pure decisions made from them: exec mode and command allowlist,
// read-only workspace, size caps, timeouts and limits, and the checks on tool
// arguments. It does no I/O. A decision is a value that carries the reason,
// and the reason is reused verbatim in logs and in the tool error the model
// reads.
//
// No tool argument can widen a Policy: tools only ever ask it.
package policy

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Decision is the outcome of a check. The zero Decision denies with no
// reason; use Allow and Deny to build one.
type Decision struct {
	Allow  bool
	Code   errcode.Code // set when denied
	Reason string       // a sentence: what was wrong and what to do instead
}

// Allowed is the Decision that allows.
var Allowed = Decision{Allow: true}

// Deny returns a denying Decision with a formatted reason.
func Deny(code errcode.Code, format string, args ...any) Decision {
	return Decision{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// String renders a denial as the tool error text: "CODE: reason".
func (d Decision) String() string {
	if d.Allow {
		return "allow"
	}
	return string(d.Code) + ": " + d.Reason
}

// Err is the denial as the error a tool returns: nil when d allows, else an
// *errcode.Error with d's code and its reason as the message.
func (d Decision) Err() error {
	if d.Allow {
		return nil
	}
	return &errcode.Error{Code: d.Code, Message: d.Reason}
}

// ExecMode says which commands may run.
type ExecMode string

// Exec modes.
const (
	ExecAllow     ExecMode = "allow"     // any command; the container is the boundary
	ExecAllowlist ExecMode = "allowlist" // only commands on AllowCmds
	ExecDeny      ExecMode = "deny"      // no command at all
)

// NetworkMode says what network a sandbox has.
type NetworkMode string

// Network modes.
const (
	NetworkNone      NetworkMode = "none"      // no network at all
	NetworkAllowlist NetworkMode = "allowlist" // an internal network and the egress proxy
)

// Defaults, as docs/policy.md's table lists them.
const (
	DefaultMaxFileBytes      = 8 << 20
	DefaultMaxOutputBytes    = 32 << 10
	DefaultMaxJobOutputBytes = 1 << 20
	DefaultMaxWorkspaceBytes = 512 << 20
	DefaultExecTimeout       = 60 * time.Second
	DefaultMaxExecTimeout    = 10 * time.Minute
	DefaultMaxCallWait       = 50 * time.Second
	// DefaultNetworkApprovalWait is how long a call waits for a person's
	// answer to an approval question (--network-approval-wait), and
	// MaxNetworkApprovalWait the most it may be set to.
	DefaultNetworkApprovalWait = 2 * time.Minute
	MaxNetworkApprovalWait     = 10 * time.Minute
	// CallerApprovalTTL is how long a person's answer "allow for this
	// caller's sandboxes" lasts (--network-approval-caller-scope).
	CallerApprovalTTL     = time.Hour
	DefaultMaxImagePixels = 40_000_000
	DefaultMemory         = 1 << 30
	DefaultCPUs           = 1.0
	DefaultPids           = 256
	DefaultMaxExecs       = 8
	DefaultListEntries    = 200
	// DefaultMaxInflightBytes and DefaultMaxSessionInflightBytes bound the
	// memory the server holds for tool calls in flight (see cost.go).
	DefaultMaxInflightBytes        = 1 << 30
	DefaultMaxSessionInflightBytes = 256 << 20
	// MaxListEntries is the ceiling for sandbox_list's max_entries.
	MaxListEntries = 10000
	// ListScanEntries bounds the directory entries one sandbox_list looks
	// at in the sandbox, listed or not (a pattern, pruned trees): past it
	// the list ends, truncated.
	ListScanEntries = 100_000
	// MaxPatternBytes is the longest pattern sandbox_list takes.
	MaxPatternBytes = 1024
	// ReadWindowLines and ReadLineChars shape a sandbox_read_file without
	// a range: at most ReadWindowLines lines (and --max-output-bytes),
	// each cut after ReadLineChars characters.
	ReadWindowLines = 2000
	ReadLineChars   = 2000
	// MaxPathBytes is the longest path a tool accepts.
	MaxPathBytes = 4096
)

// Policy is the operator's effective policy. The zero value is not useful;
// start from Default.
type Policy struct {
	Exec      ExecMode `json:"exec"`
	AllowCmds []string `json:"allow_cmd,omitempty"`
	// ReadOnly mounts the workspace read-only: no tool, exec included, can
	// change it.
	ReadOnly     bool  `json:"read_only"`
	MaxFileBytes int64 `json:"max_file_bytes"`
	// MaxOutputBytes caps the output one result carries, both streams
	// together (see OutputShares).
	MaxOutputBytes int64 `json:"max_output_bytes"`
	// MaxJobOutputBytes is the output kept per stream per job, for later
	// reads with sandbox_job.
	MaxJobOutputBytes int64         `json:"max_job_output_bytes"`
	MaxWorkspaceBytes int64         `json:"max_workspace_bytes"`
	ExecTimeout       time.Duration `json:"-"`
	MaxExecTimeout    time.Duration `json:"-"`
	// MaxCallWait is --max-call-wait: a foreground exec returns by then
	// at the latest, its command running on as its job (0: it waits for
	// the command).
	MaxCallWait time.Duration `json:"-"`
	// MaxImagePixels is --max-image-pixels: sandbox_view_image refuses an
	// image of more pixels (width × height), which a model's client would
	// scale down or refuse anyway.
	MaxImagePixels int64   `json:"max_image_pixels"`
	Memory         int64   `json:"memory_bytes"`
	CPUs           float64 `json:"cpus"`
	Pids           int64   `json:"pids"`
	// MaxExecs is --max-jobs: the number of jobs (foreground and
	// background commands) one sandbox may run at once.
	MaxExecs             int         `json:"max_jobs"`
	Network              NetworkMode `json:"network"`
	AllowHosts           []string    `json:"allow_host,omitempty"`
	AllowPrivateNetworks bool        `json:"allow_private_networks"`
	// NetworkApproval is --network-approval: the hosts (allowlist
	// patterns, "host[:port]" or "*.domain[:port]") a person may approve
	// for one sandbox when the egress proxy refused it during a call. Empty:
	// off, nobody is asked. NetworkApprovalWait bounds the wait for the
	// person's answer (--network-approval-wait).
	NetworkApproval     []string      `json:"network_approval,omitempty"`
	NetworkApprovalWait time.Duration `json:"-"`
	// NetworkApprovalCallerScope is --network-approval-caller-scope: the
	// question offers the person a third answer, allow the host for
	// every sandbox of the same caller whose policy lets a person approve
	// it, for CallerApprovalTTL.
	NetworkApprovalCallerScope bool `json:"network_approval_caller_scope,omitempty"`

	// MaxInflightBytes bounds the memory the server holds for the file,
	// list, snapshot and resource calls in flight, and for large call
	// arguments, all sessions together; MaxSessionInflightBytes bounds it
	// for one MCP session (which has one sandbox). A call reserves what it
	// may hold (see cost.go) before it starts.
	MaxInflightBytes        int64 `json:"max_inflight_bytes"`
	MaxSessionInflightBytes int64 `json:"max_session_inflight_bytes"`
}

// Default returns the policy with every default (see docs/policy.md's
// table).
func Default() Policy {
	return Policy{
		Exec:                ExecAllow,
		MaxFileBytes:        DefaultMaxFileBytes,
		MaxOutputBytes:      DefaultMaxOutputBytes,
		MaxJobOutputBytes:   DefaultMaxJobOutputBytes,
		MaxWorkspaceBytes:   DefaultMaxWorkspaceBytes,
		ExecTimeout:         DefaultExecTimeout,
		MaxExecTimeout:      DefaultMaxExecTimeout,
		MaxCallWait:         DefaultMaxCallWait,
		NetworkApprovalWait: DefaultNetworkApprovalWait,
		MaxImagePixels:      DefaultMaxImagePixels,
		Memory:              DefaultMemory,
		CPUs:                DefaultCPUs,
		Pids:                DefaultPids,
		MaxExecs:            DefaultMaxExecs,
		Network:             NetworkNone,

		MaxInflightBytes:        DefaultMaxInflightBytes,
		MaxSessionInflightBytes: DefaultMaxSessionInflightBytes,
	}
}

// Validate reports every inconsistency at once, each naming the flag to fix.
func (p Policy) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch p.Exec {
	case ExecAllow, ExecDeny:
		if len(p.AllowCmds) > 0 {
			bad("--allow-cmd is set but --exec=%s ignores it; use --exec=allowlist", p.Exec)
		}
	case ExecAllowlist:
		if len(p.AllowCmds) == 0 {
			bad("--exec=allowlist needs at least one --allow-cmd (or use --exec=deny to refuse every command)")
		}
		for _, c := range p.AllowCmds {
			if c == "" || strings.ContainsAny(c, "\x00 \t\n") {
				bad("--allow-cmd entry %q is not a command name or absolute path", c)
			} else if strings.Contains(c, "/") && !strings.HasPrefix(c, "/") {
				bad("--allow-cmd entry %q: give a bare name (looked up on the sandbox's PATH) or an absolute path", c)
			}
		}
	default:
		bad("--exec=%q: use allow, allowlist or deny", p.Exec)
	}
	if p.MaxFileBytes <= 0 {
		bad("--max-file-bytes must be positive")
	}
	if p.MaxOutputBytes < 1<<10 {
		bad("--max-output-bytes must be at least 1 KiB")
	}
	if p.MaxJobOutputBytes < p.MaxOutputBytes {
		bad("--max-job-output-bytes (%d) is below --max-output-bytes (%d): a job must keep at least what one result shows", p.MaxJobOutputBytes, p.MaxOutputBytes)
	} else if p.MaxJobOutputBytes > 64<<20 {
		bad("--max-job-output-bytes must be at most 64 MiB (it is kept per stream, per job, in the sandbox's memory)")
	}
	if p.MaxWorkspaceBytes < 1<<20 {
		bad("--max-workspace-bytes must be at least 1 MiB")
	}
	if p.ExecTimeout <= 0 || p.MaxExecTimeout <= 0 {
		bad("--exec-timeout and --max-exec-timeout must be positive")
	} else if p.ExecTimeout > p.MaxExecTimeout {
		bad("--exec-timeout (%s) is above --max-exec-timeout (%s)", p.ExecTimeout, p.MaxExecTimeout)
	}
	if p.MaxCallWait < 0 || (p.MaxCallWait > 0 && p.MaxCallWait < time.Second) {
		bad("--max-call-wait must be at least 1s (or 0: a call waits for its command, which clients that cap a call at about 60 s give up on)")
	}
	if p.MaxImagePixels <= 0 {
		bad("--max-image-pixels must be positive")
	}
	if p.Memory < 16<<20 {
		bad("--memory must be at least 16 MiB")
	} else if p.MaxWorkspaceBytes > p.Memory {
		// The workspace is a tmpfs: its pages count against the memory limit.
		bad("--max-workspace-bytes (%d) is above --memory (%d): the workspace lives in the sandbox's memory; raise --memory or lower --max-workspace-bytes", p.MaxWorkspaceBytes, p.Memory)
	}
	if p.CPUs <= 0 {
		bad("--cpus must be positive")
	}
	if p.Pids < 16 {
		bad("--pids must be at least 16")
	}
	if p.MaxExecs < 1 || p.MaxExecs > 256 {
		bad("--max-jobs must be between 1 and 256")
	}
	if err := p.validateInflight(); err != nil {
		errs = append(errs, err)
	}
	switch p.Network {
	case NetworkNone:
		if len(p.AllowHosts) > 0 {
			bad("--allow-host is set but --network=none; use --network=allowlist")
		}
	case NetworkAllowlist:
	default:
		bad("--network=%q: use none or allowlist", p.Network)
	}
	if len(p.NetworkApproval) > 0 {
		if p.Network != NetworkAllowlist {
			bad("--network-approval needs --network=allowlist: a person approves hosts at the egress proxy")
		}
		if p.NetworkApprovalWait < time.Second || p.NetworkApprovalWait > MaxNetworkApprovalWait {
			bad("--network-approval-wait must be between 1s and %s", MaxNetworkApprovalWait)
		}
	}
	if p.NetworkApprovalCallerScope && len(p.NetworkApproval) == 0 {
		bad("--network-approval-caller-scope needs --network-approval: it widens a person's answer about the hosts those patterns admit")
	}
	return errors.Join(errs...)
}
