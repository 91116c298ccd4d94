package netproxy

import "strings"

// The proxy never maps or accepts non-ASCII host names (see normalizeHost).
// This file only builds the punycode spelling that an allowlist error
// suggests ("use \"xn--bcher-kva.example\""), so an operator can copy it.
// It lowercases but does not apply the full IDNA mapping (NFC, width folding),
// so for exotic input the suggestion is a hint, not a guarantee.

// RFC 3492 section 5 parameters.
const (
	pcBase        = 36
	pcTMin        = 1
	pcTMax        = 26
	pcSkew        = 38
	pcDamp        = 700
	pcInitialBias = 72
	pcInitialN    = 128
)

// punycodeHost returns host with every non-ASCII label replaced by its
// "xn--" punycode form.
func punycodeHost(host string) string {
	labels := strings.Split(strings.ToLower(host), ".")
	for i, l := range labels {
		if !isASCII(l) {
			labels[i] = "xn--" + punycodeEncode(l)
		}
	}
	return strings.Join(labels, ".")
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// punycodeEncode implements the RFC 3492 encoding of one label.
func punycodeEncode(label string) string {
	input := []rune(label)
	var out strings.Builder
	for _, r := range input {
		if r < 0x80 {
			out.WriteRune(r)
		}
	}
	b := out.Len()
	h := b
	if b > 0 {
		out.WriteByte('-')
	}
	n, delta, bias := rune(pcInitialN), 0, pcInitialBias
	for h < len(input) {
		m := rune(0x7fffffff)
		for _, r := range input {
			if r >= n && r < m {
				m = r
			}
		}
		delta += int(m-n) * (h + 1)
		n = m
		for _, r := range input {
			if r < n {
				delta++
			}
			if r != n {
				continue
			}
			q := delta
			for k := pcBase; ; k += pcBase {
				t := k - bias
				if t < pcTMin {
					t = pcTMin
				} else if t > pcTMax {
					t = pcTMax
				}
				if q < t {
					break
				}
				out.WriteByte(punycodeDigit(t + (q-t)%(pcBase-t)))
				q = (q - t) / (pcBase - t)
			}
			out.WriteByte(punycodeDigit(q))
			bias = punycodeAdapt(delta, h+1, h == b)
			delta = 0
			h++
		}
		delta++
		n++
	}
	return out.String()
}

func punycodeAdapt(delta, numPoints int, first bool) int {
	if first {
		delta /= pcDamp
	} else {
		delta /= 2
	}
	delta += delta / numPoints
	k := 0
	for delta > ((pcBase-pcTMin)*pcTMax)/2 {
		delta /= pcBase - pcTMin
		k += pcBase
	}
	return k + (pcBase-pcTMin+1)*delta/(delta+pcSkew)
}

func punycodeDigit(d int) byte {
	if d < 26 {
		return byte('a' + d)
	}
	return byte('0' + d - 26)
}
