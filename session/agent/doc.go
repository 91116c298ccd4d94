// Package agent is the program that runs inside every sandbox container as
// its main process (under the container's init). It carries out the server's
// requests, received over the framed protocol of package agentproto on its
// stdin and stdout: it runs commands, and it reads, writes, lists, archives
// and restores files confined to the workspace.
//
// The agent runs as the sandbox's unprivileged user, beside the code it runs,
// so it holds no secret and grants nothing: it is a fast, local replacement
// for `docker exec`, not a security boundary. The boundary is the container.
// The server treats every frame the agent sends as untrusted.
//
// It ends when its stdin closes (the server went away or removed the
// sandbox) or when its lease runs out without a frame from the server; either
// way the container stops, and every process in it with it.
package agent
