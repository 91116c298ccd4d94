#!/bin/sh
# Add a team's sandbox-mcp server (served with --http behind a TLS reverse
# proxy) to Claude Code. The token is the one the server's operator gave you.
claude mcp add --transport http sandbox https://mcp.example.com/mcp \
  --header "Authorization: Bearer ${SANDBOX_MCP_TOKEN:?set SANDBOX_MCP_TOKEN to your token}"
