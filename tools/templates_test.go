package tools

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// templatesView is a server policy with two operator templates.
func templatesView() PolicyView {
	v := ViewOf(policy.Default(), "sandbox-mcp:abc", nil)
	py := policy.Default()
	py.Network, py.AllowHosts, py.Memory, py.Pids = policy.NetworkAllowlist, []string{"pypi.org"}, 512<<20, 64
	pyView := TemplateView{Name: "py", PolicyView: ViewOf(py, "sandbox-mcp:py", []string{"PIP_INDEX_URL=x"})}
	pyView.Toolbox = &Toolbox{Has: []ToolboxEntry{{Name: "python3"}, {Name: "pip"}}}
	pyView.Secrets = []SecretView{SecretViewOf("PYPI_TOKEN", []string{"pypi.org"})}
	locked := policy.Default()
	locked.ReadOnly, locked.Exec, locked.AllowCmds = true, policy.ExecAllowlist, []string{"ls", "cat"}
	v.Templates = []TemplateView{
		{Name: "locked", PolicyView: ViewOf(locked, "sandbox-mcp:abc", nil)},
		pyView,
	}
	return v
}

// TestInstructionsListTemplates: one line per template, from the
// configuration: name, image and a few of its tools, network, limits, and
// what it refuses; and within the budget.
func TestInstructionsListTemplates(t *testing.T) {
	s := Instructions(templatesView(), "sandbox-mcp:abc")
	for _, want := range []string{
		"\n- locked: image sandbox-mcp:abc; no network; 1 GiB memory, 1 CPU, 256 processes, 512 MiB workspace; only ls, cat; read-only workspace.",
		"\n- py: image sandbox-mcp:py (python3, pip); network to pypi.org; 512 MiB memory, 1 CPU, 64 processes, 512 MiB workspace; $PYPI_TOKEN.",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("instructions lack %q:\n%s", want, s)
		}
	}
	if !strings.HasSuffix(s, "The resource "+PolicyURI+" has it all.") {
		t.Errorf("instructions end %q", s[len(s)-80:])
	}
	if n := len(Instructions(ViewOf(policy.Default(), "", nil), "")); strings.Contains(Instructions(ViewOf(policy.Default(), "", nil), ""), "templates") || n == 0 {
		t.Error("instructions without templates mention them")
	}
}

// TestPolicyResourceShowsTemplates: sandbox://policy has each template
// with its whole policy.
func TestPolicyResourceShowsTemplates(t *testing.T) {
	cs := connect(t, &Deps{Policy: policy.Default(), PolicyView: templatesView(), Sessions: SessionsOver(nil), Logger: slog.New(slog.DiscardHandler)}, nil)
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: PolicyURI})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Templates []struct {
			Name       string   `json:"name"`
			Image      string   `json:"image"`
			ReadOnly   bool     `json:"read_only"`
			Exec       string   `json:"exec"`
			AllowCmd   []string `json:"allow_cmd"`
			Network    string   `json:"network"`
			AllowHosts []string `json:"allow_host"`
			Memory     int64    `json:"memory_bytes"`
			Secrets    []struct {
				Name string `json:"name"`
			} `json:"secrets"`
		} `json:"templates"`
	}
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Templates) != 2 {
		t.Fatalf("templates %+v in %s", got.Templates, rr.Contents[0].Text)
	}
	l, py := got.Templates[0], got.Templates[1]
	if l.Name != "locked" || !l.ReadOnly || l.Exec != "allowlist" || strings.Join(l.AllowCmd, ",") != "ls,cat" || l.Network != "none" {
		t.Errorf("locked: %+v", l)
	}
	if py.Name != "py" || py.Image != "sandbox-mcp:py" || py.Network != "allowlist" || strings.Join(py.AllowHosts, ",") != "pypi.org" ||
		py.Memory != 512<<20 || len(py.Secrets) != 1 || py.Secrets[0].Name != "PYPI_TOKEN" {
		t.Errorf("py: %+v", py)
	}
}
