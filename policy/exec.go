package policy

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// MaxCommandBytes is the longest command string sandbox_exec takes (it
// travels as one argv item of the shell).
const MaxCommandBytes = MaxArgvBytes - 64

// Shells are the programs a command string runs through, the first found
// in the image: bash, else sh. Each gets the string as `-c`'s argument.
var Shells = []string{"bash", "sh"}

// ShellLines reports whether sandbox_exec's command (a shell line) can run
// under p: not under --exec=deny, and under the allowlist only when a shell
// (one of Shells, by name or path) is on it. The texts a model reads say
// so up front; CheckShell decides each call, with the path the image's
// shell resolves to.
func (p Policy) ShellLines() bool {
	switch p.Exec {
	case ExecDeny:
		return false
	case ExecAllowlist:
		return slices.ContainsFunc(p.AllowCmds, func(c string) bool { return slices.Contains(Shells, path.Base(c)) })
	}
	return true
}

// CheckCommand validates sandbox_exec's choice between argv and command:
// exactly one is given, and a command is a non-empty string without NUL of
// at most MaxCommandBytes. argv itself is checked by CheckArgv.
func CheckCommand(argv []string, command string) Decision {
	switch {
	case len(argv) > 0 && command != "":
		return Deny(errcode.InvalidArgument, "give either argv or command, not both: argv runs one program with its arguments, command runs a shell line")
	case len(argv) == 0 && command == "":
		return Deny(errcode.InvalidArgument, `give argv (the program and its arguments, e.g. ["ls", "-l"]) or command (a shell line, e.g. "ls -l | head")`)
	case len(argv) > 0:
		return Allowed
	case strings.IndexByte(command, 0) >= 0:
		return Deny(errcode.InvalidArgument, "command contains a NUL byte, which no shell can receive")
	case len(command) > MaxCommandBytes:
		return Deny(errcode.TooLarge, "command is %d bytes; at most %d are allowed: write a script with sandbox_write_file and run that", len(command), MaxCommandBytes)
	}
	return Allowed
}

// CheckShell decides whether a command string may run: under the allowlist
// only when the shell it runs through (resolved inside the sandbox, "" when
// the image has none) is on it.
func (p Policy) CheckShell(shell, resolved string, allowed map[string]string) Decision {
	if d := p.CanExec(); !d.Allow {
		return d
	}
	if resolved == "" {
		return Deny(errcode.NotFound, "this sandbox's image has no shell (bash or sh) to run command with; pass argv instead")
	}
	if p.Exec != ExecAllowlist {
		return Allowed
	}
	if _, ok := allowed[resolved]; ok {
		return Allowed
	}
	return Deny(errcode.PolicyDenied, "command runs through the shell %s (%s), which is not on this server's command allowlist (allowed: %s); pass argv with an allowed program instead",
		shell, resolved, strings.Join(p.AllowCmds, ", "))
}

// shellBuiltins are the builtins models most often put in argv[0]; none
// is a program that would do what they mean.
var shellBuiltins = []string{"cd", "export", "source", ".", "alias", "unset", "set", "pushd", "popd", "ulimit", "exit", "eval", "exec"}

// shellOperators are argv items that only mean something to a shell.
var shellOperators = []string{"&&", "||", "|", ";", ">", ">>", "<", "2>&1", "&"}

// ArgvMistake recognises argv written as a shell line: argv[0] with a space
// in it (["ls -la"]) or a shell builtin (["cd", "src"]), which are refused,
// and a shell operator as an item (["make", "&&", "ls"]), which runs but
// does not do what it says. It returns the sentence that fixes it, and
// whether the command must be refused; "" when argv looks right.
func ArgvMistake(argv []string) (string, bool) {
	if len(argv) == 0 {
		return "", false
	}
	a0 := argv[0]
	if strings.ContainsAny(a0, " \t\n") {
		fields := strings.Fields(a0)
		split := strings.Join(quoteAll(append(fields, argv[1:]...)), ", ")
		return fmt.Sprintf("argv[0] %q has a space in it, but argv is not a shell line: each item is one argument. Split it ([%s]), or pass the whole line as command", clipQuote(a0), clipQuote(split)), true
	}
	if slices.Contains(shellBuiltins, a0) {
		if a0 == "cd" {
			return "cd is a shell builtin, not a program, and nothing carries a directory from one call to the next: pass the directory as cwd, or run a shell line as command (e.g. \"cd src && make\")", true
		}
		return fmt.Sprintf("%s is a shell builtin, not a program: run the shell line as command instead (e.g. \"%s ... && your-program\"); environment variables go in env, the directory in cwd", a0, a0), true
	}
	if slices.Contains([]string{"sh", "bash", "dash", "ash", "zsh"}, path.Base(a0)) {
		return "", false // a shell given its line: operators are its business
	}
	for i, a := range argv[1:] {
		if slices.Contains(shellOperators, a) || strings.Contains(a, " && ") || strings.Contains(a, " | ") {
			return fmt.Sprintf("argv[%d] is %q, which only a shell understands, and argv runs one program without a shell (the program got it as a plain argument). To run a shell line, pass it as command", i+1, clipQuote(a)), false
		}
	}
	return "", false
}

func quoteAll(items []string) []string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

func clipQuote(s string) string {
	if len(s) <= 120 {
		return s
	}
	cut := 120
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// OutputShares divides the output cap between two streams of a and b
// bytes: a stream that fits in half keeps all of it and the other takes
// the rest; else each gets half.
func OutputShares(limit, a, b int64) (int64, int64) {
	switch half := limit / 2; {
	case a+b <= limit:
		return a, b
	case a <= half:
		return a, limit - a
	case b <= limit-half:
		return limit - b, b
	default:
		return half, limit - half
	}
}

// HeadTail splits a stream's share of the cap into the head and the tail
// kept when the stream is longer: a quarter and three quarters (the end of
// a build log or a test run is where its error is).
func HeadTail(share int64) (head, tail int64) {
	head = share / 4
	return head, share - head
}

// MaxJobWait is the longest wait_ms sandbox_job takes.
const MaxJobWait = 60_000

// MaxWaitFor is the longest wait_for pattern sandbox_job takes.
const MaxWaitFor = 1024

// CheckWaitFor compiles sandbox_job's wait_for (RE2, so matching takes
// time linear in the line) after checking its length, and that it comes
// with a job and a wait.
func CheckWaitFor(pattern, job string, waitMS int64) (*regexp.Regexp, Decision) {
	if len(pattern) > MaxWaitFor {
		return nil, Deny(errcode.InvalidArgument, "wait_for is %d bytes; give a pattern of at most %d", len(pattern), MaxWaitFor)
	}
	if job == "" || waitMS <= 0 {
		return nil, Deny(errcode.InvalidArgument, "wait_for needs a job and wait_ms (how long to wait for a matching line)")
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, Deny(errcode.InvalidArgument, "wait_for %q is not a regular expression (RE2 syntax): %v", pattern, err)
	}
	return re, Allowed
}

// MaxJobStdin is the most stdin one sandbox_job call writes.
const MaxJobStdin = 64 << 10

// Signals are the signals sandbox_job sends.
var Signals = []string{"INT", "TERM", "HUP", "KILL"}

// CheckJob validates sandbox_job's arguments: a wait within 0..MaxJobWait,
// offsets not negative, stdin within MaxJobStdin, a known signal, and no
// action without a job.
func CheckJob(job string, waitMS int64, stdin string, closeStdin bool, signal string, offsets ...int64) Decision {
	if waitMS < 0 || waitMS > MaxJobWait {
		return Deny(errcode.InvalidArgument, "wait_ms is %d; give 0 to %d (milliseconds to wait for new output or the end)", waitMS, MaxJobWait)
	}
	for _, o := range offsets {
		if o < 0 {
			return Deny(errcode.InvalidArgument, "stdout_offset and stderr_offset must not be negative; omit them to read what is new")
		}
	}
	if len(stdin) > MaxJobStdin {
		return Deny(errcode.TooLarge, "stdin is %d bytes; at most %d go in one call: write larger input to a file and have the job read it", len(stdin), MaxJobStdin)
	}
	if signal != "" && !slices.Contains(Signals, signal) {
		return Deny(errcode.InvalidArgument, "signal %q is not one of %s", clip(signal), strings.Join(Signals, ", "))
	}
	if job == "" && (stdin != "" || closeStdin || signal != "" || waitMS > 0 || len(offsets) > 0) {
		return Deny(errcode.InvalidArgument, "stdin, close_stdin, signal, wait_ms and the offsets act on one job: give job (sandbox_job without arguments lists the jobs)")
	}
	return Allowed
}
