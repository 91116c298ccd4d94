// Package tools defines sandbox-mcp's MCP tools and resources: typed inputs
// and outputs, schemas, annotations, and handlers that decode, ask policy,
// call session, and render. It knows the session package's API, not Docker's.
//
// Errors follow one rule. A failure the model can act on is a tool result
// with isError set and a text that starts with one of the contract's codes
// (an *errcode.Error), then a colon, then what was wrong and what to do. A
// fault the model cannot act on is a JSON-RPC internal error, and its detail
// goes to the server log only.
package tools
