// Package tools defines sandbox-mcp's MCP tools and resources: typed inputs
// and outputs, schemas, annotations, and handlers. It knows the session
// package's API, not Docker's.
//
// Each tool is one file: its input and output types, its definition, its
// check and run functions and its rendering. One wrapper (wrap) serves
// every tool and does, in this order: the SDK decodes the arguments and
// checks them against the input schema; check asks policy about the input
// alone; the wrapper resolves the sandbox (the session's own, or the one
// the call names); run calls the sandbox and renders; the wrapper logs the
// call, feeds the audit log and sorts the errors. So a refused call never
// makes or touches a sandbox. Handlers see a sandbox through the Sandbox
// interface and the registry through Sandboxes, which a test can fake.
//
// Errors follow one rule. A failure the model can act on is a tool result
// with isError set and a text that starts with one of the contract's codes
// (an *errcode.Error), then a colon, then what was wrong and what to do. A
// fault the model cannot act on is a JSON-RPC internal error, and its detail
// goes to the server log only.
package tools
