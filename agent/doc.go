// Package agent is the program that runs inside every sandbox container as
// its main process (under the container's init). It carries out the server's
// requests, received over the framed protocol of package agentproto on its
// stdin and stdout: it runs commands, and it reads, writes, lists, archives
// and restores files confined to the workspace (package workspace does the
// file operations).
//
// Every command runs as a job (jobs.go): its output is read to the end
// whatever the caps, so the command never blocks on a full pipe, and kept
// per stream in a ring (ring.go) for later reads from any offset. A
// background job answers at once and runs until it ends, is signalled, or
// the connection ends; at most MaxJobs run at once, and the newest MaxJobs
// ended ones are kept. When the connection ends, every job's process tree
// is killed.
//
// Only cmd/sandbox-agent links this package: the server talks to it over the
// protocol alone, and it imports none of the server's packages.
//
// The agent starts as root with CAP_SETUID and CAP_SETGID only and at once
// takes the sandbox user as its effective identity (DropPrivileges): its file
// operations run as that user, and it keeps uid 0 only as its real and saved
// uid, which puts it out of the reach of the code it runs. Every command runs
// as the sandbox user with no capability, in a supplementary group of its
// own that the kill-tree finds its processes by. The agent holds no secret
// and grants nothing: it is a fast, local replacement for `docker exec`, not
// a security boundary. The boundary is the container. The server still
// treats every frame the agent sends as untrusted.
//
// It ends when its stdin closes (the server went away or removed the
// sandbox) or when its lease runs out without a frame from the server; either
// way the container stops, and every process in it with it.
package agent
