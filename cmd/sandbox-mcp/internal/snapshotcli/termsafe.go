package snapshotcli

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// termSafe makes text a caller chose (a snapshot label, a sandbox id read
// from a record, a name from an archive) safe to print on the operator's
// terminal: C0 controls, DEL, C1 controls, the Unicode line and paragraph
// separators and the bidirectional controls (which reorder what follows
// them) are written as Go escapes (\x1b, \r, \u009b, \u202e), as is every
// byte that is not UTF-8, and a backslash is doubled, so an escape in the
// output always stands for what it names. Everything else passes as is.
func termSafe(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r <= 0x9f, isBidiOrSeparator(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// isBidiOrSeparator reports the bidirectional formatting characters
// (embeddings, overrides, isolates and marks) and the line and paragraph
// separators.
func isBidiOrSeparator(r rune) bool {
	switch {
	case r == 0x061c, r == 0x200e, r == 0x200f: // ALM, LRM, RLM
		return true
	case r >= 0x2028 && r <= 0x202e: // LS, PS, LRE, RLE, PDF, LRO, RLO
		return true
	case r >= 0x2066 && r <= 0x2069: // LRI, RLI, FSI, PDI
		return true
	}
	return false
}
