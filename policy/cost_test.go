package policy

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestJSONLenMatchesEncodingJSON(t *testing.T) {
	cases := []string{
		"", "plain text", "a\nb\r\nc\td", "quote \" and \\ backslash", "<html> & </html>",
		"\x00\x01\x1f\b\f", "é ü 世界 🎉", "line\u2028para\u2029", "bad \xff\xfe utf-8 \xe2\x82",
		strings.Repeat("<", 1000),
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := make([]byte, r.IntN(64))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := JSONLen(s); got != int64(len(want)) {
			t.Errorf("JSONLen(%q) = %d, json.Marshal gives %d bytes: %s", s, got, len(want), want)
		}
	}
}

func TestDefaultBudgetsHoldTheLargestCall(t *testing.T) {
	p := Default()
	if need := p.MaxCallReserve(); need > p.MaxSessionInflightBytes {
		t.Fatalf("the largest call at the defaults reserves %d bytes, more than a session's %d", need, p.MaxSessionInflightBytes)
	}
	// Two reads at the cap fit a session at once, so one waiting for
	// another's response to be written does not stall a client.
	if 2*ReadReserve(p.MaxFileBytes) > p.MaxSessionInflightBytes {
		t.Fatalf("two reads of %d bytes do not fit a session's %d bytes", p.MaxFileBytes, p.MaxSessionInflightBytes)
	}
}

func TestValidateInflight(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Policy)
		want string // substring of the error; "" means valid
	}{
		{"defaults", func(*Policy) {}, ""},
		{"zero total", func(p *Policy) { p.MaxInflightBytes = 0 }, "must be positive"},
		{"zero session", func(p *Policy) { p.MaxSessionInflightBytes = 0 }, "must be positive"},
		{"session above total", func(p *Policy) { p.MaxInflightBytes = 200 << 20 }, "one session cannot hold more than the whole server"},
		{"session below the largest read", func(p *Policy) { p.MaxSessionInflightBytes = 64 << 20 }, "raise it, or lower --max-file-bytes"},
		{"larger files need more", func(p *Policy) { p.MaxFileBytes = 64 << 20 }, "--max-session-inflight-bytes"},
		{"smaller files need less", func(p *Policy) { p.MaxFileBytes = 1 << 20; p.MaxSessionInflightBytes = 96 << 20 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Default()
			tc.edit(&p)
			err := p.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestCosts(t *testing.T) {
	p := Default()
	if got := p.ReadLimit(0); got != p.MaxFileBytes {
		t.Errorf("ReadLimit(0) = %d, want the cap %d", got, p.MaxFileBytes)
	}
	if got := p.ReadLimit(4096); got != 4096 {
		t.Errorf("ReadLimit(4096) = %d", got)
	}
	if got := p.ReadLimit(1 << 40); got != p.MaxFileBytes {
		t.Errorf("ReadLimit above the cap = %d, want the cap", got)
	}
	if ReadReserve(4096) >= ReadReserve(p.MaxFileBytes) {
		t.Error("a read with a small length reserves as much as one at the cap")
	}
	if ArgumentsReserve(ArgumentsThreshold-1) != 0 || ArgumentsReserve(ArgumentsThreshold) == 0 {
		t.Error("arguments below the threshold count, or at it do not")
	}
	if got := Base64Len(4); got != 8 {
		t.Errorf("Base64Len(4) = %d, want 8", got)
	}
	if ListReserve(10) >= ListReserve(MaxListEntries) {
		t.Error("a short list reserves as much as the longest")
	}
}
