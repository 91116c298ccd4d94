package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/image"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// Snapshot retention defaults: enough to keep a working history without
// filling the disk unnoticed.
const (
	DefaultSnapshotMaxCount = 100
	DefaultSnapshotMaxBytes = 10 << 30
	DefaultSnapshotMaxAge   = 30 * 24 * time.Hour
)

// EnvPrefix starts the environment variable of every flag:
// --max-file-bytes is SANDBOX_MCP_MAX_FILE_BYTES.
const EnvPrefix = "SANDBOX_MCP_"

// Config is the server's whole configuration, parsed from flags, the
// environment and an optional config file (in rising precedence: file,
// environment, flags).
type Config struct {
	Policy policy.Policy
	// Image is the base image of new sandboxes.
	Image string
	// AgentBin is the static agent binary every sandbox runs.
	AgentBin string
	// AgentMount says how sandboxes get it: auto, bind or image
	// (docker.AgentMount*).
	AgentMount string
	// Env is what every sandbox gets, as NAME=VALUE (values are secret:
	// never logged).
	Env []string
	// StateDir holds snapshots and records.
	StateDir string
	// StateSlot pins the slot of StateDir this server takes
	// (session.OpenSlot); session.AnySlot takes the first free one.
	StateSlot int
	// IdleTimeout removes a sandbox unused this long.
	IdleTimeout time.Duration
	// MaxSandboxLifetime ends a sandbox made by sandbox_create this long
	// after it was made, its workspace saved first (0: never).
	MaxSandboxLifetime time.Duration
	// Lease is how long a sandbox's agent lives without hearing from the
	// server (session.Options.Lease).
	Lease time.Duration
	// EndHandlesAtStop ends sandbox_create's sandboxes at a normal stop
	// too, instead of leaving them to the next server
	// (session.Options.EndHandlesAtStop).
	EndHandlesAtStop bool
	// Runtime is the OCI runtime for sandboxes ("" = the engine's default).
	Runtime string
	// SeccompProfileFile names a seccomp profile (JSON) for sandboxes in
	// place of the engine's default ("" keeps the default); SeccompProfile
	// is its content, read and checked when the configuration is parsed.
	SeccompProfileFile string
	SeccompProfile     string
	// NetworkPool is where sandbox networks take their subnets.
	NetworkPool netip.Prefix
	// Warm is the number of sandbox containers kept started ahead of need.
	Warm int
	// WorkspaceFrom is a host directory each new workspace starts from.
	WorkspaceFrom string
	// Retention bounds the snapshots kept in the state directory.
	Retention snapshot.Retention
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// HTTP configures the streamable HTTP transport (--http and friends).
	HTTP HTTPConfig
	// SecretSpecs are the --secret values, NAME@HOST[,HOST...]; Secrets
	// the same with each value taken from the server's environment variable
	// NAME (values are secret: never logged, never in an error).
	SecretSpecs []string
	Secrets     []netproxy.Secret
	// AuditLog is the JSON-lines audit file ("" for none).
	AuditLog string
	// ConfigFile is the file the configuration was read from, if any.
	ConfigFile string
	// Kube selects and configures the Kubernetes backend.
	Kube KubeConfig
	// Templates are the operator's named sandbox templates (the config
	// file's "templates"), sorted by name; the rest of Config is the
	// default template.
	Templates []Template
}

// flagSet binds every knob to a Config. Each flag's environment variable and
// config file key follow from its name.
type flagSet struct {
	fs  *flag.FlagSet
	cfg *Config
	// source counts the layers applied so far (file, env, flags); a list
	// flag set from a new layer starts over instead of appending.
	source int
	env    envList
	// templates is the config file's "templates" value, resolved once
	// every layer is applied.
	templates json.RawMessage
}

func newFlagSet(cfg *Config, getenv func(string) string) *flagSet {
	f := &flagSet{fs: flag.NewFlagSet("sandbox-mcp", flag.ContinueOnError), cfg: cfg}
	f.env.getenv, f.env.f = getenv, f
	p := &cfg.Policy
	fs := f.fs
	fs.Var(&choice{v: (*string)(&p.Exec), allowed: []string{"allow", "allowlist", "deny"}}, "exec", "`mode`: allow any command, only an allowlist, or deny all exec")
	fs.Var(&listValue{v: &p.AllowCmds, f: f}, "allow-cmd", "comma `list` (repeatable) of commands for --exec=allowlist, matched on the resolved program")
	fs.BoolVar(&p.ReadOnly, "read-only", p.ReadOnly, "mount the workspace read-only: no tool, exec included, can change it")
	fs.Var(&bytesValue{&p.MaxFileBytes}, "max-file-bytes", "largest file read or written in one call (`bytes`, e.g. 8MiB)")
	fs.Var(&bytesValue{&p.MaxOutputBytes}, "max-output-bytes", "output one exec or job result carries, both streams together; a longer stream keeps its head and tail (`bytes`)")
	fs.Var(&bytesValue{&p.MaxJobOutputBytes}, "max-job-output-bytes", "output kept per stream, per job, for reads with sandbox_job; the oldest is dropped past it (`bytes`)")
	fs.Var(&bytesValue{&p.MaxWorkspaceBytes}, "max-workspace-bytes", "workspace size and snapshot ceiling (`bytes`)")
	fs.DurationVar(&p.ExecTimeout, "exec-timeout", p.ExecTimeout, "default timeout of a command")
	fs.DurationVar(&p.MaxExecTimeout, "max-exec-timeout", p.MaxExecTimeout, "ceiling for a command's timeout_ms")
	fs.DurationVar(&p.MaxCallWait, "max-call-wait", p.MaxCallWait, "longest a foreground sandbox_exec waits: past it the call returns running: true and the command goes on as its job, its timeout kept (0: wait for the command; clients cap a call at about 60s)")
	fs.Int64Var(&p.MaxImagePixels, "max-image-pixels", p.MaxImagePixels, "largest image sandbox_view_image returns, in pixels (width × height); a larger one is refused with how to scale it down")
	fs.Var(&bytesValue{&p.Memory}, "memory", "memory limit of a sandbox, swap included (`bytes`)")
	fs.Float64Var(&p.CPUs, "cpus", p.CPUs, "CPU limit of a sandbox")
	fs.Int64Var(&p.Pids, "pids", p.Pids, "process limit of a sandbox")
	fs.IntVar(&p.MaxExecs, "max-jobs", p.MaxExecs, "jobs (foreground and background commands) one sandbox runs at once; more get BUSY")
	fs.IntVar(&p.MaxExecs, "max-execs", p.MaxExecs, "the old name of --max-jobs")
	fs.Var(&bytesValue{&p.MaxInflightBytes}, "max-inflight-bytes", "memory (`bytes`) the server holds at most for file, list, snapshot and resource calls in flight, all sandboxes together; more get BUSY")
	fs.Var(&bytesValue{&p.MaxSessionInflightBytes}, "max-session-inflight-bytes", "memory (`bytes`) one sandbox's calls in flight may hold at most, within --max-inflight-bytes")
	fs.Var(&choice{v: (*string)(&p.Network), allowed: []string{"none", "allowlist"}}, "network", "`mode`: none (no network at all) or allowlist (an internal network whose only way out is the egress proxy)")
	fs.Var(&listValue{v: &p.AllowHosts, f: f}, "allow-host", "comma `list` (repeatable) of host[:port] or *.domain[:port] the proxy admits (port default 443)")
	fs.Var(&listValue{v: &p.NetworkApproval, f: f}, "network-approval", "comma `list` (repeatable) of host[:port] or *.domain[:port] a person may approve for one sandbox when the proxy refuses it during a call (MCP elicitation; off when empty)")
	fs.BoolVar(&p.NetworkApprovalCallerScope, "network-approval-caller-scope", p.NetworkApprovalCallerScope, "let the person answering an approval question allow the host for every sandbox of the same caller for an hour, not only the one that asked (within each sandbox's --network-approval patterns)")
	fs.DurationVar(&p.NetworkApprovalWait, "network-approval-wait", p.NetworkApprovalWait, "longest a call waits for a person's answer to an approval question; no answer is a refusal")
	fs.BoolVar(&p.AllowPrivateNetworks, "allow-private-networks", p.AllowPrivateNetworks, "let allowed names resolve to private, loopback and CGNAT addresses (tests, intranets)")
	fs.Var(prefixValue{&cfg.NetworkPool}, "network-pool", "IPv4 `prefix` sandbox networks take their /29 subnets from")
	fs.IntVar(&cfg.Warm, "warm", cfg.Warm, "sandbox containers kept started ahead of need, so a new session's first call does not wait for one (they count against --max-sandboxes)")
	fs.StringVar(&cfg.WorkspaceFrom, "workspace-from", cfg.WorkspaceFrom, "host `dir`ectory each new workspace starts with a copy of (read once at start, capped at --max-workspace-bytes, symlinks not followed, a file hard-linked from outside it refused)")
	fs.IntVar(&cfg.Retention.MaxCount, "snapshot-max-count", cfg.Retention.MaxCount, "snapshots kept in --state-dir in all; past it, the oldest of the caller holding the most go first (0: no limit)")
	fs.Var(&bytesValue{&cfg.Retention.MaxBytes}, "snapshot-max-bytes", "total `bytes` of snapshots kept in all, those being written included; past it, the oldest of the caller holding the most go first (0: no limit)")
	fs.IntVar(&cfg.Retention.PerCallerCount, "snapshot-max-count-per-caller", cfg.Retention.PerCallerCount, "snapshots one caller keeps; past it, that caller's oldest go first (0: a quarter of --snapshot-max-count over --http, all of it over stdio)")
	fs.Var(&bytesValue{&cfg.Retention.PerCallerBytes}, "snapshot-max-bytes-per-caller", "total `bytes` of one caller's snapshots; past it, that caller's oldest go first (0: a quarter of --snapshot-max-bytes over --http, all of it over stdio)")
	fs.DurationVar(&cfg.Retention.MaxAge, "snapshot-max-age", cfg.Retention.MaxAge, "snapshots older than this are deleted (0: no limit)")
	fs.StringVar(&cfg.Image, "image", cfg.Image, "base `image` of new sandboxes; must exist locally")
	fs.StringVar(&cfg.AgentBin, "agent-bin", cfg.AgentBin, "`path` of the static sandbox-agent binary")
	fs.Var(&choice{v: &cfg.AgentMount, allowed: []string{docker.AgentMountAuto, docker.AgentMountBind, docker.AgentMountImage}}, "agent-mount", "`how` sandboxes get the agent: bind (a read-only bind mount of a copy in --state-dir: nothing to build at start), image (an image of --image with the agent added, built once per agent: for an engine on another machine), or auto (bind where the engine's socket is local and it sees the file)")
	fs.Var(&secretSpecList{v: &cfg.SecretSpecs, f: f}, "secret", "`NAME@HOST[,HOST...][:header=FIELD][:url]`, repeatable (several joined by ';' in the environment variable): sandboxes get NAME set to a placeholder, and the egress proxy puts the value of this server's own variable NAME in its place into the Authorization header (and the FIELD headers; the path and query only with :url) of requests to those hosts; needs --network=allowlist with each host on --allow-host")
	fs.Var(&f.env, "env", "`NAME=VALUE` or NAME (take this server's value), repeatable: variables every sandbox gets")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "`dir`ectory for snapshots and records")
	fs.IntVar(&cfg.StateSlot, "state-slot", cfg.StateSlot, "the `slot` of --state-dir whose sandbox records this server takes (0 to 63; a slot is one running server's, held by a lock): -1 takes the first free one, which after a crash is the one the server had (see docs/restart.md)")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "remove a sandbox unused this long (0: never)")
	fs.DurationVar(&cfg.MaxSandboxLifetime, "max-sandbox-lifetime", cfg.MaxSandboxLifetime, "end a sandbox made by sandbox_create this long after it was made, its workspace saved as a snapshot first (0: never)")
	fs.DurationVar(&cfg.Lease, "lease", cfg.Lease, "how long a sandbox outlives a server that is gone (killed, crashed) without a word: a server started again on the same --state-dir within it takes the sandbox back, jobs included; past it the sandbox ends itself (at least 4s)")
	fs.BoolVar(&cfg.EndHandlesAtStop, "end-handles-at-stop", cfg.EndHandlesAtStop, "at a normal stop (SIGTERM, SIGINT, stdin closed) end the sandboxes made by sandbox_create too; by default they keep running, jobs included, for the server started next on the same --state-dir within --lease (an upgrade), and end by themselves past it")
	fs.StringVar(&cfg.Runtime, "runtime", cfg.Runtime, "OCI `runtime` for sandboxes, e.g. runsc where gVisor is installed (default: the engine's)")
	fs.StringVar(&cfg.SeccompProfileFile, "seccomp-profile", cfg.SeccompProfileFile, "seccomp profile `file` (JSON) for sandboxes in place of the engine's default, e.g. examples/seccomp-no-io_uring.json")
	fs.Var(&choice{v: &cfg.LogLevel, allowed: []string{"debug", "info", "warn", "error"}}, "log-level", "log `level`: debug, info, warn or error")
	fs.StringVar(&cfg.ConfigFile, "config", "", "JSON config `file`: an object whose keys are flag names (flags and the environment win over it)")
	f.addTransportFlags(cfg)
	f.addKubeFlags(cfg)
	return f
}

// defaultConfig returns the configuration before any flag, variable or file.
func defaultConfig(getenv func(string) string) Config {
	return Config{
		Policy:      policy.Default(),
		Image:       image.DefaultTag(),
		AgentBin:    defaultAgentBin(),
		AgentMount:  docker.AgentMountAuto,
		StateDir:    defaultStateDir(getenv),
		StateSlot:   session.AnySlot,
		IdleTimeout: 15 * time.Minute,
		Lease:       session.DefaultLease,
		NetworkPool: docker.DefaultNetworkPool,
		Retention:   snapshot.Retention{MaxCount: DefaultSnapshotMaxCount, MaxBytes: DefaultSnapshotMaxBytes, MaxAge: DefaultSnapshotMaxAge},
		LogLevel:    "info",
		HTTP:        HTTPConfig{MaxSandboxes: DefaultMaxSandboxes, DefaultSandbox: DefaultSandboxNone},
		Kube:        KubeConfig{Backend: BackendDocker},
	}
}

// ParseConfig builds the Config from args (without the program name), the
// environment (through getenv) and the config file that --config or
// SANDBOX_MCP_CONFIG names.
func ParseConfig(args []string, getenv func(string) string) (Config, error) {
	cfg, rest, err := parseConfig(args, getenv)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("unexpected argument %q (see sandbox-mcp -h)", rest[0])
	}
	return cfg, err
}

// parseConfig is ParseConfig that returns the arguments after the flags
// instead of refusing them.
func parseConfig(args []string, getenv func(string) string) (Config, []string, error) {
	cfg := defaultConfig(getenv)
	f := newFlagSet(&cfg, getenv)
	f.fs.SetOutput(io.Discard)

	// The config file is found first: it is the lowest layer.
	file := getenv(EnvPrefix + "CONFIG")
	for i, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "config" {
			if hasVal {
				file = val
			} else if i+1 < len(args) {
				file = args[i+1]
			}
		}
	}
	if file != "" {
		f.source++
		if err := f.applyFile(file); err != nil {
			return cfg, nil, err
		}
	}
	f.source++
	if err := f.applyEnv(getenv); err != nil {
		return cfg, nil, err
	}
	f.source++
	if err := f.fs.Parse(args); err != nil {
		return cfg, nil, fmt.Errorf("%w (see sandbox-mcp -h)", err)
	}
	cfg.ConfigFile = file
	cfg.Env = f.env.resolved
	var serr, terr error
	cfg.Secrets, serr = resolveSecrets(cfg.SecretSpecs, getenv)
	if serr == nil {
		cfg.Templates, terr = parseTemplates(cfg, file, f.templates, getenv)
	}
	err := errors.Join(serr, terr, cfg.Validate())
	if cfg.SeccompProfileFile != "" {
		var perr error
		cfg.SeccompProfile, perr = loadSeccompProfile(cfg.SeccompProfileFile)
		err = errors.Join(err, perr)
	}
	return cfg, f.fs.Args(), err
}

// maxSeccompProfile bounds the profile file read at start; the engine's
// default profile is under 20 KiB.
const maxSeccompProfile = 1 << 20

// loadSeccompProfile reads a seccomp profile and checks that it is one: a
// JSON object with a defaultAction. It returns the profile compacted, as
// the engine receives it.
func loadSeccompProfile(path string) (string, error) {
	const hint = "give a JSON seccomp profile such as examples/seccomp-no-io_uring.json (the engine's default without io_uring)"
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--seccomp-profile: %w; %s", err, hint)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSeccompProfile+1))
	if err != nil {
		return "", fmt.Errorf("--seccomp-profile %s: %w", path, err)
	}
	if len(b) > maxSeccompProfile {
		return "", fmt.Errorf("--seccomp-profile %s is larger than %d bytes; %s", path, maxSeccompProfile, hint)
	}
	var profile struct {
		DefaultAction string `json:"defaultAction"`
	}
	if err := json.Unmarshal(b, &profile); err != nil {
		return "", fmt.Errorf("--seccomp-profile %s is not a JSON object (%v); %s", path, err, hint)
	}
	if profile.DefaultAction == "" {
		return "", fmt.Errorf("--seccomp-profile %s has no \"defaultAction\"; %s", path, hint)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return "", fmt.Errorf("--seccomp-profile %s: %w", path, err)
	}
	return compact.String(), nil
}

func (f *flagSet) applyFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("--config %s: not a JSON object: %w", path, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == TemplatesKey {
			f.templates, _ = json.Marshal(m[k])
			continue
		}
		if k == "config" || f.fs.Lookup(k) == nil {
			return fmt.Errorf("--config %s: unknown key %q; keys are flag names such as \"exec\" or \"max-file-bytes\", and \"templates\" (docs/templates.md)", path, k)
		}
		var vals []string
		switch v := m[k].(type) {
		case []any:
			for _, e := range v {
				vals = append(vals, fmt.Sprint(e))
			}
		case float64:
			vals = []string{strconv.FormatFloat(v, 'f', -1, 64)}
		default:
			vals = []string{fmt.Sprint(v)}
		}
		for _, v := range vals {
			if err := f.fs.Set(k, v); err != nil {
				return fmt.Errorf("--config %s: %s: %w", path, k, err)
			}
		}
	}
	return nil
}

func (f *flagSet) applyEnv(getenv func(string) string) error {
	var err error
	f.fs.VisitAll(func(fl *flag.Flag) {
		if err != nil || fl.Name == "config" {
			return
		}
		name := EnvVar(fl.Name)
		v := getenv(name)
		if v == "" {
			return
		}
		if e := f.fs.Set(fl.Name, v); e != nil {
			err = fmt.Errorf("%s: %w", name, e)
		}
	})
	return err
}

// EnvVar returns the environment variable of a flag.
func EnvVar(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Validate checks the configuration, naming the flag to fix.
func (c Config) Validate() error {
	errs := []error{c.Policy.Validate(), c.validateKube()}
	if c.Image == "" {
		errs = append(errs, errors.New("--image is empty"))
	}
	if c.StateSlot < session.AnySlot || c.StateSlot >= session.MaxSlots {
		errs = append(errs, fmt.Errorf("--state-slot %d is out of range: give 0 to %d, or -1 for the first free one", c.StateSlot, session.MaxSlots-1))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("--state-dir is empty and no default was found (set HOME or XDG_STATE_HOME)"))
	}
	if c.Policy.Network == policy.NetworkAllowlist {
		if _, err := netproxy.ParseAllowlist(c.Policy.AllowHosts); err != nil {
			errs = append(errs, fmt.Errorf("--allow-host: %w", err))
		}
		if len(c.Policy.AllowHosts) == 0 {
			errs = append(errs, errors.New("--network=allowlist with no --allow-host lets nothing out; name the hosts to allow, or use --network=none"))
		}
	}
	if _, err := netproxy.ParseAllowlist(c.Policy.NetworkApproval); err != nil {
		errs = append(errs, fmt.Errorf("--network-approval: %w", err))
	}
	if c.Policy.AllowPrivateNetworks && c.Policy.Network != policy.NetworkAllowlist {
		errs = append(errs, errors.New("--allow-private-networks needs --network=allowlist"))
	}
	if !c.NetworkPool.Addr().Is4() || c.NetworkPool.Bits() > 29 {
		errs = append(errs, fmt.Errorf("--network-pool %s: give an IPv4 prefix of /29 or larger, e.g. 198.18.0.0/15", c.NetworkPool))
	}
	if c.Warm < 0 {
		errs = append(errs, errors.New("--warm must not be negative"))
	}
	if c.HTTP.MaxSandboxes > 0 && c.Warm > c.HTTP.MaxSandboxes {
		errs = append(errs, fmt.Errorf("--warm %d is above --max-sandboxes %d; warm containers count against it", c.Warm, c.HTTP.MaxSandboxes))
	}
	if c.WorkspaceFrom != "" {
		if st, err := os.Stat(c.WorkspaceFrom); err != nil || !st.IsDir() {
			errs = append(errs, fmt.Errorf("--workspace-from %s is not a directory", c.WorkspaceFrom))
		}
	}
	if r := c.Retention; r.MaxCount < 0 || r.MaxBytes < 0 || r.MaxAge < 0 || r.PerCallerCount < 0 || r.PerCallerBytes < 0 {
		errs = append(errs, errors.New("--snapshot-max-count, --snapshot-max-bytes, --snapshot-max-age and their -per-caller forms must not be negative"))
	}
	if c.MaxSandboxLifetime < 0 {
		errs = append(errs, errors.New("--max-sandbox-lifetime must not be negative (0: never)"))
	}
	if c.Lease < 4*time.Second {
		errs = append(errs, fmt.Errorf("--lease %s is too short: give at least 4s (a server that takes a sandbox back is silent for 2.5s first)", c.Lease))
	}
	if c.IdleTimeout < 0 {
		errs = append(errs, errors.New("--idle-timeout must not be negative"))
	}
	errs = append(errs, c.HTTP.Validate(), checkEnv(c.Env, c.HTTP.Tokens), c.checkSecrets())
	return errors.Join(errs...)
}

// checkSecrets refuses secrets the proxy could not put into requests: they
// need --network=allowlist and each host on --allow-host. It refuses an
// --env variable that a secret names (the sandbox gets the placeholder
// there) or whose value holds a secret's value. No message quotes a value.
func (c Config) checkSecrets() error {
	if len(c.Secrets) == 0 {
		return nil
	}
	var errs []error
	if c.Policy.Network != policy.NetworkAllowlist {
		errs = append(errs, fmt.Errorf("--secret %s: secrets are put into requests by the egress proxy, which only --network=allowlist has; set --network=allowlist and put each of the secret's hosts on --allow-host", c.Secrets[0].Name))
	} else if allow, err := netproxy.ParseAllowlist(c.Policy.AllowHosts); err == nil {
		if err := netproxy.CheckSecrets(c.Secrets, allow); err != nil {
			errs = append(errs, fmt.Errorf("--secret: %w", err))
		}
	}
	for _, kv := range c.Env {
		name, val, _ := strings.Cut(kv, "=")
		if slices.Contains(session.CABundleVars, name) {
			errs = append(errs, fmt.Errorf("--env %s: with --secret, %s points at the sandbox's CA bundle (the image's roots and the proxy's CA); drop it from --env, and add other CAs to the image's roots instead", name, name))
		}
		for _, s := range c.Secrets {
			switch {
			case name == s.Name:
				errs = append(errs, fmt.Errorf("--env %s: %s is a --secret, and the sandboxes get a placeholder in it; drop it from --env", name, name))
			case s.Value != "" && strings.Contains(val, s.Value):
				errs = append(errs, fmt.Errorf("--env %s: its value contains the value of the secret %s, and every sandbox would see it; pass the sandboxes a value that holds no secret", name, s.Name))
			}
		}
	}
	return errors.Join(errs...)
}

// resolveSecrets parses the --secret values and takes each value from the
// server's environment variable of the secret's name.
func resolveSecrets(specs []string, getenv func(string) string) ([]netproxy.Secret, error) {
	var out []netproxy.Secret
	var errs []error
	seen := map[string]bool{}
	for _, spec := range specs {
		sec, err := netproxy.ParseSecretSpec(spec)
		name := sec.Name
		if err != nil {
			errs = append(errs, fmt.Errorf("--secret %w", err))
			continue
		}
		if seen[name] {
			errs = append(errs, fmt.Errorf("--secret %s is given twice; give it once, with all its hosts after the @", name))
			continue
		}
		seen[name] = true
		if strings.HasPrefix(strings.ToUpper(name), EnvPrefix) {
			errs = append(errs, fmt.Errorf("--secret %s: variables named %s* configure this server; keep the secret in a variable of another name", name, EnvPrefix))
			continue
		}
		val := getenv(name)
		if val == "" {
			errs = append(errs, fmt.Errorf("--secret %s: this server's environment has no %s; set it where the server starts (its value never goes on the command line or into a sandbox)", name, name))
			continue
		}
		sec.Value = val
		out = append(out, sec)
	}
	return out, errors.Join(errs...)
}

// secretSpecList is --secret: NAME@HOST[,HOST...][:OPTION...], repeatable; one value may
// hold several joined by ';' (the form of the environment variable). A new
// layer (file, environment, flags) replaces what an earlier layer set.
type secretSpecList struct {
	v      *[]string
	f      *flagSet
	source int
}

func (l *secretSpecList) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ";")
}

func (l *secretSpecList) Set(s string) error {
	if l.source != l.f.source {
		*l.v, l.source = nil, l.f.source
	}
	for _, e := range strings.Split(s, ";") {
		if e = strings.TrimSpace(e); e != "" {
			if _, err := netproxy.ParseSecretSpec(e); err != nil {
				return err
			}
			*l.v = append(*l.v, e)
		}
	}
	return nil
}

// checkEnv refuses --env variables that would hand the server's own
// configuration to every sandbox: a variable named SANDBOX_MCP_* (in either
// form, NAME=VALUE or NAME), or a value that holds an HTTP token anywhere in
// it (so a token list, or a token inside a URL, is refused too). No message
// quotes a value.
func checkEnv(env, tokens []string) error {
	var errs []error
	for _, kv := range env {
		name, val, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(strings.ToUpper(name), EnvPrefix) {
			errs = append(errs, fmt.Errorf("--env %s: variables named %s* configure this server (its tokens among them) and never enter a sandbox; give the sandboxes what they need under another name", name, EnvPrefix))
			continue
		}
		for _, t := range tokens {
			if t != "" && strings.Contains(val, t) {
				errs = append(errs, fmt.Errorf("--env %s: its value contains an HTTP token (--token or %s), and every sandbox would see it; pass the sandboxes a value that holds no token", name, EnvVar("token")))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// memoryBase is what the soft memory limit allows the server besides calls
// in flight: the idle process (about 12 MiB as the Go runtime counts it),
// its sessions (a fraction of a MiB each) and the request being read. With
// the binary's own pages, which the runtime does not count, and the limit
// being soft, the server's RSS stays under its idle RSS plus what calls may
// hold plus 64 MiB.
const memoryBase = 48 << 20

// MemoryLimit is the soft limit given to the Go runtime (GOMEMLIMIT) unless
// the environment sets one: what calls in flight may hold, and the base.
// Near it the garbage collector runs more often, so garbage of finished
// calls does not pile up beside the live calls' memory. Over stdio there is
// one session, so one sandbox: its share is all calls may hold.
func (c Config) MemoryLimit() int64 {
	inflight := c.Policy.MaxInflightBytes
	if c.HTTP.Addr == "" {
		inflight = min(inflight, c.Policy.MaxSessionInflightBytes)
	}
	return inflight + memoryBase
}

func defaultStateDir(getenv func(string) string) string {
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "sandbox-mcp")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".local", "state", "sandbox-mcp")
	}
	return ""
}

func defaultAgentBin() string {
	exe, err := os.Executable()
	if err != nil {
		return "sandbox-agent"
	}
	return filepath.Join(filepath.Dir(exe), "sandbox-agent")
}

// prefixValue is an IP prefix flag.
type prefixValue struct{ v *netip.Prefix }

func (p prefixValue) String() string {
	if p.v == nil || !p.v.IsValid() {
		return ""
	}
	return p.v.String()
}

func (p prefixValue) Set(s string) error {
	v, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("%q is not a prefix such as 198.18.0.0/15", s)
	}
	*p.v = v.Masked()
	return nil
}

// choice is a string flag limited to some values.
type choice struct {
	v       *string
	allowed []string
}

func (c *choice) String() string {
	if c.v == nil {
		return ""
	}
	return *c.v
}

func (c *choice) Set(s string) error {
	for _, a := range c.allowed {
		if s == a {
			*c.v = s
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %s", s, strings.Join(c.allowed, ", "))
}

// listValue is a comma list flag that can be repeated. A new layer (file,
// environment, flags) replaces what an earlier layer set.
type listValue struct {
	v      *[]string
	f      *flagSet
	source int
}

func (l *listValue) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}

func (l *listValue) Set(s string) error {
	if l.source != l.f.source {
		*l.v, l.source = nil, l.f.source
	}
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			*l.v = append(*l.v, e)
		}
	}
	return nil
}

// envList is --env: NAME=VALUE, or NAME to take the server's own value.
type envList struct {
	getenv   func(string) string
	resolved []string
	source   int
	f        *flagSet
}

func (e *envList) String() string {
	names := make([]string, len(e.resolved))
	for i, kv := range e.resolved {
		names[i], _, _ = strings.Cut(kv, "=")
	}
	return strings.Join(names, ",")
}

func (e *envList) Set(s string) error {
	name, val, hasVal := strings.Cut(s, "=")
	if !policy.ValidEnvName(name) {
		return fmt.Errorf("%q: want NAME=VALUE or NAME, with NAME matching [A-Za-z_][A-Za-z0-9_]*", name)
	}
	if !hasVal {
		val = e.getenv(name)
	}
	if e.source != e.f.source {
		e.resolved, e.source = nil, e.f.source
	}
	if strings.IndexByte(val, 0) >= 0 {
		return fmt.Errorf("%s: value contains NUL", name)
	}
	e.resolved = append(e.resolved, name+"="+val)
	return nil
}

// bytesValue is a byte count with an optional unit: 1048576, 512KiB, 8MiB,
// 1GiB (also k, m, g, KB, MB, GB as powers of 1024).
type bytesValue struct{ v *int64 }

func (b *bytesValue) String() string {
	if b.v == nil {
		return ""
	}
	return strconv.FormatInt(*b.v, 10)
}

func (b *bytesValue) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b.v = n
	return nil
}

var bytesRE = regexp.MustCompile(`^(\d+)\s*([kKmMgGtT]?)(i?[bB])?$`)

// ParseBytes parses a byte count such as "8MiB".
func ParseBytes(s string) (int64, error) {
	m := bytesRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is not a byte count such as 1048576, 512KiB, 8MiB or 1GiB", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}
	shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[strings.ToLower(m[2])]
	if n > (1<<63-1)>>shift {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n << shift, nil
}

// SnapshotRetention is the retention the server applies: a per-caller cap
// left at 0 is a quarter of the total over --http, where callers share the
// state directory, and the total itself over stdio, which has one caller.
func (c Config) SnapshotRetention() snapshot.Retention {
	r := c.Retention
	share := func(total int64) int64 {
		if c.HTTP.Addr == "" || total == 0 {
			return total
		}
		return max(total/4, 1)
	}
	if r.PerCallerCount == 0 {
		r.PerCallerCount = int(share(int64(r.MaxCount)))
	}
	if r.PerCallerBytes == 0 {
		r.PerCallerBytes = share(r.MaxBytes)
	}
	return r
}
