package tools

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
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
	ApproveHostForCaller(host string, port int) (time.Time, error)
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
	AnswerApproved = "approved" // the person chose allow
	// AnswerApprovedCaller: the person chose allow for all the caller's
	// sandboxes, for an hour (--network-approval-caller-scope).
	AnswerApprovedCaller = "approved_for_caller"
	AnswerDenied         = "denied"    // the person chose deny
	AnswerDeclined       = "declined"  // the person declined the form
	AnswerCancelled      = "cancelled" // the person dismissed it
	AnswerTimeout        = "timeout"   // no answer within --network-approval-wait
	AnswerFailed         = "failed"    // the client failed to ask, or the approval failed
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
	mu      sync.Mutex
	asked   map[string]*asked           // by sandbox id
	order   []string                    // sandbox ids, oldest first
	pending map[string]*pendingApproval // results waiting for answers (2026-07-28), by requestState
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

// question is one refused host a person may be asked about.
type question struct {
	host    string
	port    int
	pattern string
}

// questions sorts a command's refusals: the hosts a person may be asked
// about now (counted against the bounds), and the answers given before
// (denied or declined: never asked again). canAsk is whether the client
// can be asked at all.
func (d *Deps) questions(sb Sandbox, refused []session.NetworkRefusal, canAsk bool) ([]question, map[string]approval) {
	if _, ok := sb.(networkSandbox); !ok || d.approvableHosts == nil || len(refused) == 0 {
		return nil, nil
	}
	out := map[string]approval{}
	var qs []question
	for _, r := range refused {
		key := hostPort(r.Host, r.Port)
		pattern, ok := d.approvable(r.Host, r.Port)
		if !r.Unlisted || !ok {
			continue
		}
		if _, done := out[key]; done || slices.ContainsFunc(qs, func(q question) bool { return q.host == r.Host && q.port == r.Port }) {
			continue
		}
		d.approvals.mu.Lock()
		rec := d.approvals.of(sb.ID())
		prior, final := rec.final[key]
		allowed := !final && canAsk && len(qs) < maxQuestionsPerCall && rec.questions < maxQuestionsPerSandbox
		if allowed {
			rec.questions++
		}
		d.approvals.mu.Unlock()
		switch {
		case final:
			out[key] = approval{answer: prior}
		case allowed:
			qs = append(qs, question{r.Host, r.Port, pattern})
		}
	}
	return qs, out
}

// askApprovals asks the person about each refusal that may be approved,
// within the call (server-initiated elicitation, before 2026-07-28), and
// approves what the person allows. It returns what became of each
// host:port asked about or answered before.
func (d *Deps) askApprovals(ctx context.Context, c *call, sb Sandbox, refused []session.NetworkRefusal) map[string]approval {
	qs, out := d.questions(sb, refused, elicitForm(c.req))
	for _, q := range qs {
		out[hostPort(q.host, q.port)] = d.ask(ctx, c, sb, q)
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

// Decisions of the approval form.
const (
	decisionAllow       = "allow"
	decisionDeny        = "deny"
	decisionAllowCaller = "allow-all-my-sandboxes-1h"
)

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

// approvalSchemaCaller is the form with the third answer the operator
// permits (--network-approval-caller-scope).
var approvalSchemaCaller = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"decision": map[string]any{
			"type":  "string",
			"title": "Allow this host for this sandbox?",
			"enum":  []string{decisionAllow, decisionAllowCaller, decisionDeny},
			"description": "allow: this sandbox may reach this host and port from now until it ends; " +
				decisionAllowCaller + ": every sandbox of the same caller may reach it for the next hour; deny: it stays refused.",
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

// approvalRecord is the audit record of a question about q in call c.
func (d *Deps) approvalRecord(c *call, sb Sandbox, q question) ApprovalRecord {
	return ApprovalRecord{
		Caller: d.Sessions.Owner(c.req), Session: sessionID(c.req), Sandbox: sb.ID(), Tool: c.req.Params.Name,
		Host: q.host, Port: q.port, Pattern: q.pattern,
	}
}

// ask puts one question to the person, within the call, and records it
// and its answer.
func (d *Deps) ask(ctx context.Context, c *call, sb Sandbox, q question) approval {
	rec := d.approvalRecord(c, sb, q)
	params := d.questionParams(sb, q)
	d.recordApproval(rec, "question", "", params.Message)
	wait := d.Policy.NetworkApprovalWait
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := c.req.Session.Elicit(actx, params)
	var a approval
	switch {
	case err != nil && ctx.Err() != nil:
		a = approval{answer: AnswerCancelled, detail: "the call was cancelled before the person answered"}
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || actx.Err() != nil):
		a = approval{answer: AnswerTimeout, detail: fmt.Sprintf("no answer within %s", wait)}
	case err != nil:
		a = approval{answer: AnswerFailed, detail: "the client could not ask: " + err.Error()}
	default:
		a = d.settle(sb, q, res)
	}
	d.answered(rec, sb, q, a)
	return a
}

func (d *Deps) questionParams(sb Sandbox, q question) *mcp.ElicitParams {
	msg, schema := approvalQuestion(sb.ID(), q.host, q.port, q.pattern), approvalSchema
	if d.Policy.NetworkApprovalCallerScope {
		msg += fmt.Sprintf(" (Or allow it for every sandbox of this caller for the next %s: %s.)", policy.CallerApprovalTTL, decisionAllowCaller)
		schema = approvalSchemaCaller
	}
	return &mcp.ElicitParams{Mode: "form", Message: msg, RequestedSchema: schema}
}

// settle acts on the person's answer res (nil: none came).
func (d *Deps) settle(sb Sandbox, q question, res *mcp.ElicitResult) approval {
	switch {
	case res == nil:
		return approval{answer: AnswerCancelled, detail: "the client sent no answer"}
	case res.Action == "accept" && res.Content["decision"] == decisionAllow:
		if err := sb.(networkSandbox).ApproveHost(q.host, q.port); err != nil {
			return approval{answer: AnswerFailed, detail: "the person allowed it, but " + err.Error()}
		}
		return approval{answer: AnswerApproved}
	case res.Action == "accept" && res.Content["decision"] == decisionAllowCaller && d.Policy.NetworkApprovalCallerScope:
		until, err := sb.(networkSandbox).ApproveHostForCaller(q.host, q.port)
		if err != nil {
			return approval{answer: AnswerFailed, detail: "the person allowed it for all the caller's sandboxes, but " + err.Error()}
		}
		return approval{answer: AnswerApprovedCaller, detail: "until " + until.UTC().Format(time.RFC3339)}
	case res.Action == "accept":
		return approval{answer: AnswerDenied}
	case res.Action == "decline":
		return approval{answer: AnswerDeclined}
	}
	return approval{answer: AnswerCancelled, detail: "the person dismissed the question"}
}

// answered records an answer: in the audit log, the server log, and for a
// denial, as final for the sandbox.
func (d *Deps) answered(rec ApprovalRecord, sb Sandbox, q question, a approval) {
	if a.answer == AnswerDenied || a.answer == AnswerDeclined {
		d.approvals.mu.Lock()
		d.approvals.of(sb.ID()).final[hostPort(q.host, q.port)] = a.answer
		d.approvals.mu.Unlock()
	}
	d.recordApproval(rec, "answer", a.answer, a.detail)
	d.Logger.Info("network approval", "sandbox", sb.ID(), "host", q.host, "port", q.port, "pattern", q.pattern, "answer", a.answer, "detail", a.detail)
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
	case AnswerApprovedCaller:
		return "a person approved " + hp + " for all this caller's sandboxes just now, " + a.detail + ": run the command again"
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
func parseApprovable(patterns []string) *session.HostPatterns {
	if len(patterns) == 0 {
		return nil
	}
	a, err := session.ParseHostPatterns(patterns)
	if err != nil {
		return nil
	}
	return a
}

// On 2026-07-28 a server may not send requests while it serves a call: the
// questions go back as the call's result (inputRequests, SEP-2322), the
// command's result waits on the server under an unguessable requestState,
// and the client calls again with the person's answers, which settle the
// questions and release the result. The client's retry runs nothing again.

// mrtrElicit reports whether the client of req speaks 2026-07-28 and
// declared form elicitation.
func mrtrElicit(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil {
		return false
	}
	ip := req.Session.InitializeParams()
	if ip == nil || ip.ProtocolVersion < "2026-07-28" || ip.Capabilities == nil || ip.Capabilities.Elicitation == nil {
		return false
	}
	e := ip.Capabilities.Elicitation
	return e.Form != nil || e.URL == nil
}

// Bounds of the results waiting for answers (2026-07-28).
const (
	maxPendingApprovals = 256
	pendingApprovalTTL  = 15 * time.Minute
)

// pendingApproval is a result waiting for a person's answers.
type pendingApproval struct {
	sandbox, owner string
	questions      map[string]question // by input request id
	answers        map[string]approval // answered before
	finish         any                 // func(*call, map[string]approval) (*mcp.CallToolResult, Out, error)
	expires        time.Time
}

// approveThen settles a command's refusals and returns its result through
// finish: the questions asked within the call (before 2026-07-28), or put
// in an input-required result (2026-07-28).
func approveThen[Out any](ctx context.Context, d *Deps, c *call, sb Sandbox, refused []session.NetworkRefusal,
	finish func(*call, map[string]approval) (*mcp.CallToolResult, Out, error)) (*mcp.CallToolResult, Out, error) {
	if !mrtrElicit(c.req) {
		return finish(c, d.askApprovals(ctx, c, sb, refused))
	}
	qs, answers := d.questions(sb, refused, true)
	if len(qs) == 0 {
		return finish(c, answers)
	}
	p := &pendingApproval{sandbox: sb.ID(), owner: d.Sessions.Owner(c.req), questions: map[string]question{},
		answers: answers, finish: finish, expires: time.Now().Add(pendingApprovalTTL)}
	reqs := mcp.InputRequestMap{}
	for i, q := range qs {
		id := "approve-" + strconv.Itoa(i)
		p.questions[id] = q
		params := d.questionParams(sb, q)
		reqs[id] = params
		d.recordApproval(d.approvalRecord(c, sb, q), "question", "", params.Message)
	}
	token := rand.Text() // 130 bits
	d.approvals.mu.Lock()
	if d.approvals.pending == nil {
		d.approvals.pending = map[string]*pendingApproval{}
	}
	now := time.Now()
	for k, v := range d.approvals.pending {
		if now.After(v.expires) {
			delete(d.approvals.pending, k)
		}
	}
	full := len(d.approvals.pending) >= maxPendingApprovals
	if !full {
		d.approvals.pending[token] = p
	}
	d.approvals.mu.Unlock()
	if full {
		return finish(c, answers) // no room to wait: today's refusal
	}
	var none Out
	return &mcp.CallToolResult{InputRequests: reqs, RequestState: token}, none, nil
}

// resumeApproval serves a call that answers questions (2026-07-28): it
// settles them with the person's answers and returns the waiting result.
// resumed is false for a call that carries no requestState.
func resumeApproval[Out any](d *Deps, c *call, sb Sandbox) (res *mcp.CallToolResult, out Out, err error, resumed bool) {
	token := c.req.Params.RequestState
	if token == "" {
		return nil, out, nil, false
	}
	d.approvals.mu.Lock()
	p := d.approvals.pending[token]
	if p != nil && p.sandbox == sb.ID() && p.owner == d.Sessions.Owner(c.req) {
		delete(d.approvals.pending, token)
	} else {
		p = nil
	}
	d.approvals.mu.Unlock()
	finish, ok := any(nil), false
	if p != nil {
		finish = p.finish
	}
	f, ok := finish.(func(*call, map[string]approval) (*mcp.CallToolResult, Out, error))
	if p == nil || !ok || time.Now().After(p.expires) {
		return nil, out, errcode.Errorf(errcode.InvalidArgument, "this call answers questions the server no longer waits for (they expired after %s, or were answered); run the command again", pendingApprovalTTL), true
	}
	answers := p.answers
	if answers == nil {
		answers = map[string]approval{}
	}
	for id, q := range p.questions {
		er, _ := c.req.Params.InputResponses[id].(*mcp.ElicitResult)
		a := d.settle(sb, q, er)
		answers[hostPort(q.host, q.port)] = a
		d.answered(d.approvalRecord(c, sb, q), sb, q, a)
	}
	res, out, err = f(c, answers)
	return res, out, err, true
}
