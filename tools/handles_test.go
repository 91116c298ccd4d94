package tools

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// The fake registry's sandboxes by handle: Create answers with the handle
// sb-made, List with two sandboxes, End with a snapshot when asked for one.

func (f *fakeSandboxes) Create(ctx context.Context, owner string, o session.CreateOptions) (session.SandboxInfo, error) {
	f.record("Create label=%s template=%s snapshot=%s", o.Label, o.Template, o.Snapshot)
	if o.Template != "" && o.Template != "default" {
		return session.SandboxInfo{}, errcode.Errorf(errcode.NotFound, "no template %q", o.Template)
	}
	in := session.SandboxInfo{Handle: "sb-made", Label: o.Label, Template: "default", State: session.StateNew}
	if o.Snapshot != "" {
		in.From = "snap-0123456789abcdef0123"
	}
	return in, nil
}

var fakeCreated = time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)

func (f *fakeSandboxes) List(ctx context.Context, owner string) []session.SandboxInfo {
	f.record("List")
	return []session.SandboxInfo{
		{Handle: "sb-fake", Template: "default", State: session.StateRunning, Session: true, Created: fakeCreated, LastUsed: fakeCreated.Add(time.Minute), Jobs: 2},
		{Handle: "sb-made", Label: "clean one", Template: "default", State: session.StateIdleSaved, Created: fakeCreated.Add(time.Hour), LastUsed: fakeCreated.Add(2 * time.Hour), Jobs: 0},
	}
}

func (f *fakeSandboxes) End(ctx context.Context, id, owner string, snapshotFirst bool) (*snapshot.Info, error) {
	f.record("End %s %v", id, snapshotFirst)
	if id != "sb-made" {
		return nil, errcode.Errorf(errcode.NotFound, "no sandbox %q belongs to you; sandbox_status lists yours and sandbox_create makes one", id)
	}
	if !snapshotFirst {
		return nil, nil
	}
	return &snapshot.Info{ID: "snap-0123456789abcdef0123"}, nil
}

// textCarries fails the test unless every string and number of the
// structured content is in the text: some clients show the model only
// the text.
func textCarries(t *testing.T, txt string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "hint" {
				x = strings.TrimSuffix(s, "; sandbox_end ends it")
			}
			textCarries(t, txt, x)
		}
	case []any:
		for _, x := range v {
			textCarries(t, txt, x)
		}
	case string:
		if v != "" && !strings.Contains(txt, v) {
			t.Errorf("the text does not carry %q:\n%s", v, txt)
		}
	case float64:
		if !strings.Contains(txt, fmt.Sprint(v)) {
			t.Errorf("the text does not carry %v:\n%s", v, txt)
		}
	}
}

// TestHandleTools: sandbox_create, sandbox_status and sandbox_end ask the
// registry for what their arguments say, make no session sandbox, and
// render everything in the text as well as in the structured content.
func TestHandleTools(t *testing.T) {
	r := newFakeRig(t, nil)

	res := r.call(NameCreate, map[string]any{"label": "clean one", "snapshot": "latest"})
	out := structured(t, res)
	if res.IsError || out["sandbox"] != "sb-made" || out["label"] != "clean one" || out["template"] != "default" || out["state"] != "new" || out["snapshot"] != "snap-0123456789abcdef0123" {
		t.Fatalf("create: %s %v", text(res), out)
	}
	if h, _ := out["hint"].(string); !strings.Contains(h, `"sandbox": "sb-made"`) {
		t.Errorf("the hint does not say to pass the handle: %q", h)
	}
	textCarries(t, text(res), out)

	res = r.call(NameStatus, map[string]any{})
	out = structured(t, res)
	list, _ := out["sandboxes"].([]any)
	if res.IsError || len(list) != 2 {
		t.Fatalf("status: %s %v", text(res), out)
	}
	first := list[0].(map[string]any)
	if first["sandbox"] != "sb-fake" || first["session"] != true || first["jobs_running"] != float64(2) || first["created"] != "2026-12-02T06:00:00Z" || first["state"] != "running" {
		t.Errorf("first listed: %v", first)
	}
	textCarries(t, text(res), out)
	if lines := strings.Split(strings.TrimSpace(text(res)), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[2], "sb-made  idle-saved  default  0  ") {
		t.Errorf("the table:\n%s", text(res))
	}

	res = r.call(NameEnd, map[string]any{"sandbox": "sb-made", "snapshot": true})
	out = structured(t, res)
	if res.IsError || out["ended"] != true || out["snapshot"] != "snap-0123456789abcdef0123" {
		t.Fatalf("end: %s %v", text(res), out)
	}
	textCarries(t, text(res), out)

	res = r.call(NameEnd, map[string]any{"sandbox": "sb-gone"})
	if got := text(res); !res.IsError || !strings.HasPrefix(got, "NOT_FOUND: ") || !strings.Contains(got, "sandbox_status") {
		t.Errorf("end of an unknown handle: %q", got)
	}
	for _, args := range []map[string]any{{}, {"sandbox": ""}} {
		if res := r.call(NameEnd, args); !res.IsError || !strings.HasPrefix(text(res), "INVALID_ARGUMENT: ") {
			t.Errorf("end(%v): %q", args, text(res))
		}
	}
	res = r.call(NameCreate, map[string]any{"template": "gpu"})
	if got := text(res); !res.IsError || !strings.HasPrefix(got, "NOT_FOUND: ") {
		t.Errorf("create from an unknown template: %q", got)
	}

	want := []string{
		"Create label=clean one template= snapshot=latest", "List", "End sb-made true", "End sb-gone false",
		"Create label= template=gpu snapshot=",
	}
	if calls := r.f.made(); !slices.Equal(calls, want) {
		t.Errorf("calls %q, want %q (and no session sandbox)", calls, want)
	}
}

// TestNoticeComesFirstOnce: what the sandbox has to tell about how it came
// back (restored after its idle removal) leads the next result's text,
// once.
func TestNoticeComesFirstOnce(t *testing.T) {
	r := newFakeRig(t, nil)
	r.sb.notice = "sandbox sb-fake was removed after 15m unused (--idle-timeout)"
	res := r.call(NameExec, map[string]any{"argv": []string{"true"}})
	if got := text(res); res.IsError || !strings.HasPrefix(got, "NOTE: sandbox sb-fake was removed after 15m unused (--idle-timeout)\n\n") {
		t.Fatalf("first result: %q", got)
	}
	res = r.call(NameExec, map[string]any{"argv": []string{"true"}})
	if got := text(res); strings.Contains(got, "NOTE:") {
		t.Fatalf("the notice came twice: %q", got)
	}
}
