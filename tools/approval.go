package tools

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// A person approves a host for one sandbox (--network-approval): when a
// command's result has refusals of hosts that are on none of the
// sandbox's lists, that match the operator's patterns of approvable hosts,
// and the client declared form elicitation, the call asks the person,
// before it returns, whether to allow each one for this sandbox. Nothing
// the model sends adds a host: only the person's "allow" does, and only a
// host the proxy refused and the operator's patterns admit.

// networkSandbox is what a session sandbox can do with its egress
// allowlist; a sandbox without it (a test's) is never asked about.
type networkSandbox interface {
	ApproveHost(host string, port int) error
	NarrowNetwork(drop []string, offline bool) error
	NetworkLayers() (session.NetworkLayers, bool)
}

var _ networkSandbox = (*session.Sandbox)(nil)

// Bounds of the questions: per call, and per sandbox for its life, so that
// a model cannot flood the person with questions.
const (
	maxQuestionsPerCall    = 3
	maxQuestionsPerSandbox = 16
	// maxAskedSandboxes bounds the sandboxes whose answers are kept; past
	// it the oldest record is forgotten.
	maxAskedSandboxes = 4096
)

// Answers to an approval question, as the audit log and the hints name
// them.
const (
	AnswerApproved  = "approved"  // the person chose allow
	AnswerDenied    = "denied"    // the person chose deny
	AnswerDeclined  = "declined"  // the person declined the form
	AnswerCancelled = "cancelled" // the person dismissed it
	AnswerTimeout   = "timeout"   // no answer within --network-approval-wait
	AnswerFailed    = "failed"    // the client failed to ask, or the approval failed
)

// ApprovalRecord is one question to a person, or its answer, for the audit
// log.
type ApprovalRecord struct {
	Time    time.Time
	Event   string // "question" or "answer"
	Caller  string
	Session string
	Sandbox string
	Tool    string
	Host    string
	Port    int
	Pattern string // the operator's pattern the host matched
	Answer  string // an Answer* constant; "" in a question
	Detail  string // the question's text, or what went wrong
}

// approvals is the server's record of what was asked, per sandbox.
type approvals struct {
	mu    sync.Mutex
	asked map[string]*asked // by sandbox id
	order []string          // sandbox ids, oldest first
}

type asked struct {
	questions int
	final     map[string]string // host:port -> denied or declined: never asked again
}

func (a *approvals) of(sandbox string) *asked {
	if a.asked == nil {
		a.asked = map[string]*asked{}
	}
	s := a.asked[sandbox]
	if s == nil {
		if len(a.order) >= maxAskedSandboxes {
			delete(a.asked, a.order[0])
			a.order = a.order[1:]
		}
		s = &asked{final: map[string]string{}}
		a.asked[sandbox] = s
		a.order = append(a.order, sandbox)
	}
	return s
}

// approval is what became of one refused host in this call.
type approval struct {
	answer string // an Answer*, or "" when nobody was asked
	detail string
}

// elicitForm reports whether the client of req declared form elicitation
// on a protocol where the server may ask during a call.
func elicitForm(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil {
		return false
	}
	ip := req.Session.InitializeParams()
	if ip == nil || ip.Capabilities == nil || ip.Capabilities.Elicitation == nil {
		return false
	}
	if ip.ProtocolVersion >= "2026-07-28" {
		return false // server-initiated requests are forbidden there
	}
	e := ip.Capabilities.Elicitation
	return e.Form != nil || e.URL == nil // neither declared means form
}

// approvable returns the operator's pattern h:port matches, if any.
func (d *Deps) approvable(host string, port int) (string, bool) {
	if d.approvableHosts == nil {
		return "", false
	}
	return d.approvableHosts.Match(host, port)
}

// askApprovals asks the person about each refusal that may be approved,
// and approves what the person allows. It returns what became of each
// host:port asked about or answered before.
func (d *Deps) askApprovals(ctx context.Context, c *call, sb Sandbox, tool string, refused []session.NetworkRefusal) map[string]approval {
	nsb, ok := sb.(networkSandbox)
	if !ok || d.approvableHosts == nil || len(refused) == 0 {
		return nil
	}
	out := map[string]approval{}
	canAsk := elicitForm(c.req)
	questions := 0
	for _, r := range refused {
		key := hostPort(r.Host, r.Port)
		pattern, ok := d.approvable(r.Host, r.Port)
		if !r.Unlisted || !ok {
			continue
		}
		if _, done := out[key]; done {
			continue
		}
		d.approvals.mu.Lock()
		rec := d.approvals.of(sb.ID())
		prior, final := rec.final[key]
		allowed := !final && canAsk && questions < maxQuestionsPerCall && rec.questions < maxQuestionsPerSandbox
		if allowed {
			rec.questions++
		}
		d.approvals.mu.Unlock()
		switch {
		case final:
			out[key] = approval{answer: prior}
			continue
		case !allowed:
			continue
		}
		questions++
		a := d.ask(ctx, c, nsb, sb.ID(), tool, r.Host, r.Port, pattern)
		out[key] = a
		if a.answer == AnswerDenied || a.answer == AnswerDeclined {
			d.approvals.mu.Lock()
			d.approvals.of(sb.ID()).final[key] = a.answer
			d.approvals.mu.Unlock()
		}
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

// approvalSchema is the form the person answers: allow or deny.
var approvalSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"decision": map[string]any{
			"type":        "string",
			"title":       "Allow this host for this sandbox?",
			"enum":        []string{"allow", "deny"},
			"description": "allow: the sandbox may reach this host and port from now until it ends; deny: it stays refused.",
		},
	},
	"required": []string{"decision"},
}

// approvalQuestion is the text the person reads. host is a normalised
// ASCII name (letters, digits, '-' and '.': the proxy refuses anything
// else), so it cannot pass for another.
func approvalQuestion(sandbox, host string, port int, pattern string) string {
	return fmt.Sprintf("The sandbox %s tried to reach %s:%d, which is not on its allowed hosts. "+
		"The operator lets a person approve hosts matching %s. Allow %s:%d for this sandbox, for the rest of its life?",
		sandbox, host, port, pattern, host, port)
}

// ask puts one question to the person, within the call, and records it
// and its answer.
func (d *Deps) ask(ctx context.Context, c *call, sb networkSandbox, id, tool, host string, port int, pattern string) approval {
	rec := ApprovalRecord{
		Caller: d.Sessions.Owner(c.req), Session: sessionID(c.req), Sandbox: id, Tool: tool,
		Host: host, Port: port, Pattern: pattern,
	}
	msg := approvalQuestion(id, host, port, pattern)
	d.recordApproval(rec, "question", "", msg)
	wait := d.Policy.NetworkApprovalWait
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := c.req.Session.Elicit(actx, &mcp.ElicitParams{Mode: "form", Message: msg, RequestedSchema: approvalSchema})
	var a approval
	switch {
	case err != nil && ctx.Err() != nil:
		a = approval{answer: AnswerCancelled, detail: "the call was cancelled before the person answered"}
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || actx.Err() != nil):
		a = approval{answer: AnswerTimeout, detail: fmt.Sprintf("no answer within %s", wait)}
	case err != nil:
		a = approval{answer: AnswerFailed, detail: "the client could not ask: " + err.Error()}
	case res.Action == "accept" && res.Content["decision"] == "allow":
		if err := sb.ApproveHost(host, port); err != nil {
			a = approval{answer: AnswerFailed, detail: "the person allowed it, but " + err.Error()}
		} else {
			a = approval{answer: AnswerApproved}
		}
	case res.Action == "accept":
		a = approval{answer: AnswerDenied}
	case res.Action == "decline":
		a = approval{answer: AnswerDeclined}
	default:
		a = approval{answer: AnswerCancelled, detail: "the person dismissed the question"}
	}
	d.recordApproval(rec, "answer", a.answer, a.detail)
	d.Logger.Info("network approval", "sandbox", id, "host", host, "port", port, "pattern", pattern, "answer", a.answer, "detail", a.detail)
	return a
}

func (d *Deps) recordApproval(r ApprovalRecord, event, answer, detail string) {
	if d.AuditApproval == nil {
		return
	}
	r.Time, r.Event, r.Answer, r.Detail = time.Now().UTC(), event, answer, detail
	d.AuditApproval(r)
}

// approvalSentence is what the hint says of a refused host after the
// question (or its earlier answer).
func approvalSentence(p policy.Policy, host string, port int, a approval) string {
	hp := host + ":" + strconv.Itoa(port)
	switch a.answer {
	case AnswerApproved:
		return "a person approved " + hp + " for this sandbox just now: run the command again"
	case AnswerDenied:
		return "a person was asked and denied " + hp + " for this sandbox; it stays refused (only the server's operator can allow it)"
	case AnswerDeclined:
		return "a person was asked and declined to allow " + hp + " for this sandbox; it stays refused (only the server's operator can allow it)"
	case AnswerTimeout:
		return fmt.Sprintf("a person was asked whether to allow %s for this sandbox and did not answer within %s; it stays refused", hp, p.NetworkApprovalWait)
	case AnswerCancelled:
		return "a person was asked whether to allow " + hp + " for this sandbox and the question was dismissed; it stays refused"
	case AnswerFailed:
		return "asking a person to allow " + hp + " failed (" + a.detail + "); it stays refused"
	}
	return ""
}

// parseApprovable parses the operator's patterns; nil when there are none
// (the server's configuration was checked at start).
func parseApprovable(patterns []string) *netproxy.Allowlist {
	if len(patterns) == 0 {
		return nil
	}
	a, err := netproxy.ParseAllowlist(patterns)
	if err != nil {
		return nil
	}
	return a
}
