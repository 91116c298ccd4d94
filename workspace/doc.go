// Package workspace confines file operations to the tree under one
// directory: read, write and list (workspace.go), reads by line
// (lines.go), edits in place (edit.go), delete and move (move.go, which
// refuse every symlink on their paths), a tar stream of the whole
// tree out (snapshot.go) and in (restore.go), every path resolved by the
// kernel with openat2 below a descriptor of the root, so that no path,
// symlink or ".." leads outside it (workspace.go states the model and its
// limits).
//
// Two sides use it. Inside each sandbox the agent serves the workspace's
// file requests with it. On the host the server reads --workspace-from with
// SnapshotTree, and `sandbox-mcp snapshot export` unpacks a snapshot with
// Extract, both with the same confinement.
//
// Failures the caller can act on are coded errors (errors.go maps each
// errno to its code and a sentence naming the path and what to do).
package workspace
