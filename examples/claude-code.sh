#!/bin/sh
# Add sandbox-mcp to Claude Code for the current project (or use --scope user).
claude mcp add sandbox -- /path/to/sandbox-mcp/bin/sandbox-mcp --exec-timeout 2m
