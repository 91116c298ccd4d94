#!/bin/sh
# Add a team's sandbox-mcp server (served with --http behind a TLS reverse
# proxy) to Claude Code, in the project's .mcp.json (see claude-code-mcp.json).
# The single quotes keep ${SANDBOX_MCP_TOKEN} as written: Claude Code fills it
# in from the environment when it starts, so the token the server's operator
# gave you is stored neither in ~/.claude.json nor in the repository.
# export SANDBOX_MCP_TOKEN=... before starting Claude Code.
claude mcp add-json --scope project sandbox \
  '{"type":"http","url":"https://mcp.example.com/mcp","headers":{"Authorization":"Bearer ${SANDBOX_MCP_TOKEN}"}}'
