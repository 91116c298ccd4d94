package tools

import (
	"fmt"
	"strings"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// Instructions returns the server's instructions, which a client gives the
// model once, with the tools: what the sandbox is, what it has, what lasts
// between calls and what does not, and the policy, all from the server's
// configuration (v; defaultImage is the default image's tag, to tell the
// toolbox from an operator's image). What the image has and lacks comes from
// its manifest (v.Toolbox), which the image's build wrote. It is short: clients put it in every
// conversation.
func Instructions(v PolicyView, defaultImage string) string {
	p := v.Policy
	var b strings.Builder
	switch v.ImplicitSandbox {
	case SessionlessNone.String():
		b.WriteString("A call without `sandbox` uses your MCP session's sandbox, a Linux container made at your first call and removed when the session ends; without sessions (MCP 2026-07-28) create one with sandbox_create and pass its handle in `sandbox`. ")
	case SessionlessPerCaller.String():
		b.WriteString("A call without `sandbox` uses your MCP session's sandbox, a Linux container made at your first call and removed when the session ends; without sessions (MCP 2026-07-28) it uses your one default sandbox. ")
	default:
		b.WriteString("Calls without `sandbox` share one sandbox: a Linux container, made at your first call and removed when this connection ends. ")
	}
	b.WriteString("sandbox_create makes more: handles to pass as sandbox, kept until sandbox_end. ")
	switch {
	case v.Toolbox != nil:
		if v.Image != "" && v.Image != defaultImage {
			fmt.Fprintf(&b, "Its image is %s, the operator's choice, built on this server's toolbox. ", v.Image)
		}
		b.WriteString(v.Toolbox.sentence())
		b.WriteString("Nothing installs system-wide (the root filesystem is read-only): pip and npm install into the workspace or $HOME. ")
	case v.Image == "" || v.Image == defaultImage:
		b.WriteString("Its image is this server's toolbox; list its tools with `ls /usr/local/bin /usr/bin`. ")
	default:
		fmt.Fprintf(&b, "Its image is %s, the operator's choice; list its tools with `ls /usr/local/bin /usr/bin`. ", v.Image)
	}
	switch {
	case p.Network == policy.NetworkNone:
		b.WriteString("It has no network: nothing can be downloaded or installed from the internet. ")
	case len(p.AllowHosts) == 0:
		b.WriteString("Its network goes through a proxy that allows no host. ")
	default:
		fmt.Fprintf(&b, "Its network reaches only %s (HTTPS, through the proxy HTTPS_PROXY names); anything else is refused. ", strings.Join(p.AllowHosts, ", "))
	}

	paragraph(&b)
	b.WriteString("Files under /workspace last for the session (tool paths are relative to it; sandbox_snapshot keeps them longer); " +
		"the rest of the filesystem is read-only but a small /tmp. ")
	if p.Exec != policy.ExecDeny {
		if p.ShellLines() {
			b.WriteString("Each command runs afresh: the working directory, exported variables and shell state do not carry over to the next call, so pass cwd and env, or chain steps in one shell line (command). ")
		} else {
			b.WriteString("Each command runs afresh: the working directory and variables do not carry over to the next call, so pass cwd and env. ")
		}
		fmt.Fprintf(&b, "A command is killed with everything it started after timeout_ms (default %s, at most %s). ", shortDuration(p.ExecTimeout), shortDuration(p.MaxExecTimeout))
		if p.MaxCallWait > 0 {
			fmt.Fprintf(&b, "A call returns within %s: a command still running then goes on as its job (running: true); follow it with sandbox_job wait_ms. ", shortDuration(p.MaxCallWait))
		}
		b.WriteString("For servers, watchers and long builds, start it with background: true and follow it with sandbox_job (read output, send input or a signal; without job it lists your jobs). ")
		b.WriteString("Search with `rg`; apply a unified diff with `patch -p1` or `git apply`. ")
	}

	paragraph(&b)
	b.WriteString("Policy: ")
	switch p.Exec {
	case policy.ExecDeny:
		b.WriteString("no commands run here; use the file tools. ")
	case policy.ExecAllowlist:
		fmt.Fprintf(&b, "only these programs run: %s. ", strings.Join(p.AllowCmds, ", "))
		if !p.ShellLines() {
			b.WriteString("argv only; shell lines are refused here. ")
		}
	default:
		b.WriteString("any command may run. ")
	}
	if p.ReadOnly {
		b.WriteString("The workspace is read-only: nothing can change it. ")
	}
	fmt.Fprintf(&b, "Files up to %s per read or write; results carry at most %s of output (head and tail); the workspace holds %s; %s of memory, %g CPU, %d processes. ",
		sizeOf(p.MaxFileBytes), sizeOf(p.MaxOutputBytes), sizeOf(p.MaxWorkspaceBytes), sizeOf(p.Memory), p.CPUs, p.Pids)
	for _, sec := range v.Secrets {
		fmt.Fprintf(&b, "$%s is the credential for %s: it holds a placeholder the proxy replaces in HTTPS requests to those hosts, so use it as is. ", sec.Name, strings.Join(sec.Hosts, ", "))
	}
	if len(v.EnvNames) > 0 {
		fmt.Fprintf(&b, "Set for every command: %s. ", strings.Join(v.EnvNames, ", "))
	}
	if len(v.Templates) > 0 {
		paragraph(&b)
		b.WriteString("Sandbox templates (by name, when you create a sandbox; none can be widened):")
		for _, t := range v.Templates {
			b.WriteString("\n- " + templateLine(t))
		}
		paragraph(&b)
	}
	b.WriteString("The resource " + PolicyURI + " has it all.")
	return b.String()
}

// maxTemplateTools bounds the programs a template's line names.
const maxTemplateTools = 6

// templateLine is one template in one line: name, image and a few of its
// tools, network, limits and what it refuses.
func templateLine(t TemplateView) string {
	p := t.Policy
	var parts []string
	img := "image " + clip(t.Image, 64)
	if t.Toolbox != nil && len(t.Toolbox.Has) > 0 {
		var names []string
		for _, e := range t.Toolbox.Has[:min(len(t.Toolbox.Has), maxTemplateTools)] {
			names = append(names, clip(e.Name, 32))
		}
		img += " (" + strings.Join(names, ", ")
		if len(t.Toolbox.Has) > maxTemplateTools {
			img += ", …"
		}
		img += ")"
	}
	parts = append(parts, img)
	if p.Network == policy.NetworkAllowlist {
		parts = append(parts, "network to "+strings.Join(p.AllowHosts, ", "))
	} else {
		parts = append(parts, "no network")
	}
	parts = append(parts, fmt.Sprintf("%s memory, %g CPU, %d processes, %s workspace", sizeOf(p.Memory), p.CPUs, p.Pids, sizeOf(p.MaxWorkspaceBytes)))
	switch p.Exec {
	case policy.ExecDeny:
		parts = append(parts, "no commands")
	case policy.ExecAllowlist:
		parts = append(parts, "only "+strings.Join(p.AllowCmds, ", "))
	}
	if p.ReadOnly {
		parts = append(parts, "read-only workspace")
	}
	for _, s := range t.Secrets {
		parts = append(parts, "$"+s.Name)
	}
	return t.Name + ": " + strings.Join(parts, "; ") + "."
}

// paragraph ends a paragraph of b.
func paragraph(b *strings.Builder) {
	s := strings.TrimRight(b.String(), " ")
	b.Reset()
	b.WriteString(s + "\n\n")
}

// sizeOf writes a byte count the way people read it: 8 MiB, 512 KiB.
func sizeOf(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// shortDuration writes 1m0s as 1m and 10m0s as 10m.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
