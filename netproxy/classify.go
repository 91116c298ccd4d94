package netproxy

import "net/netip"

// Address classes reported by [Classify]. A class is a short, stable word used
// in refusal reasons and logs.
const (
	ClassInvalid        = "invalid"         // the zero netip.Addr
	ClassUnspecified    = "unspecified"     // 0.0.0.0, ::  (Go dials these as "the local system")
	ClassThisNetwork    = "this-network"    // 0.0.0.0/8
	ClassLoopback       = "loopback"        // 127.0.0.0/8, ::1
	ClassPrivate        = "private"         // 10/8, 172.16/12, 192.168/16, fc00::/7
	ClassCGNAT          = "cgnat"           // 100.64.0.0/10 (RFC 6598 shared address space)
	ClassLinkLocal      = "link-local"      // 169.254.0.0/16, fe80::/10
	ClassSiteLocal      = "site-local"      // fec0::/10 (deprecated)
	ClassMetadata       = "metadata"        // cloud instance-metadata and host-agent addresses
	ClassIETFProtocol   = "ietf-protocol"   // 192.0.0.0/24, 2001::/23
	ClassDocumentation  = "documentation"   // TEST-NET-1/2/3, 2001:db8::/32, 3fff::/20
	ClassBenchmarking   = "benchmarking"    // 198.18.0.0/15, 2001:2::/48
	ClassMulticast      = "multicast"       // 224.0.0.0/4, ff00::/8
	ClassBroadcast      = "broadcast"       // 255.255.255.255
	ClassReserved       = "reserved"        // 240.0.0.0/4, IPv6 outside 2000::/3, 5f00::/16
	ClassIPv4Compatible = "ipv4-compatible" // ::/96 (deprecated)
	ClassIPv4Translated = "ipv4-translated" // ::ffff:0:0:0/96 (RFC 2765)
	ClassNAT64          = "nat64"           // 64:ff9b::/96, 64:ff9b:1::/48
	Class6to4           = "6to4"            // 2002::/16 and its IPv4 relay anycast 192.88.99.0/24
	ClassTeredo         = "teredo"          // 2001::/32
	ClassDiscard        = "discard"         // 100::/64
)

type classRule struct {
	prefix netip.Prefix
	class  string
}

func rules(class string, prefixes ...string) []classRule {
	out := make([]classRule, len(prefixes))
	for i, p := range prefixes {
		out[i] = classRule{netip.MustParsePrefix(p), class}
	}
	return out
}

func concat(lists ...[]classRule) []classRule {
	var out []classRule
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// The tables are read-only after package initialisation. Order matters: the
// first matching prefix wins, so exact addresses (metadata) come before the
// ranges that contain them. Sources: the IANA IPv4 and IPv6 Special-Purpose
// Address Registries, RFC 6052/8215 (NAT64), RFC 3056 (6to4), RFC 4380
// (Teredo), RFC 9637 (3fff::/20), RFC 9602 (5f00::/16), and the metadata
// addresses of AWS (IMDS, ECS, EKS pod identity), GCP, Azure (IMDS and
// WireServer), Oracle Cloud and Alibaba Cloud.
var (
	ipv4Rules = concat(
		rules(ClassMetadata,
			"169.254.169.254/32", // AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle, ...
			"169.254.170.2/32",   // AWS ECS task metadata and credentials
			"169.254.170.23/32",  // AWS EKS pod identity agent
			"192.0.0.192/32",     // Oracle Cloud
			"168.63.129.16/32",   // Azure WireServer (a public address)
			"100.100.100.200/32", // Alibaba Cloud
		),
		rules(ClassBroadcast, "255.255.255.255/32"),
		rules(ClassUnspecified, "0.0.0.0/32"),
		rules(ClassThisNetwork, "0.0.0.0/8"),
		rules(ClassPrivate, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
		rules(ClassCGNAT, "100.64.0.0/10"),
		rules(ClassLoopback, "127.0.0.0/8"),
		rules(ClassLinkLocal, "169.254.0.0/16"),
		rules(ClassIETFProtocol, "192.0.0.0/24"),
		rules(ClassDocumentation, "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"),
		rules(Class6to4, "192.88.99.0/24"),
		rules(ClassBenchmarking, "198.18.0.0/15"),
		rules(ClassMulticast, "224.0.0.0/4"),
		rules(ClassReserved, "240.0.0.0/4"),
	)
	ipv6Rules = concat(
		rules(ClassUnspecified, "::/128"),
		rules(ClassLoopback, "::1/128"),
		rules(ClassMetadata,
			"fd00:ec2::254/128", // AWS IMDS over IPv6
			"fd00:ec2::23/128",  // AWS EKS pod identity agent over IPv6
		),
		rules(ClassIPv4Translated, "::ffff:0:0:0/96"),
		rules(ClassIPv4Compatible, "::/96"),
		rules(ClassNAT64, "64:ff9b::/96", "64:ff9b:1::/48"),
		rules(ClassDiscard, "100::/64"),
		rules(ClassTeredo, "2001::/32"),
		rules(ClassBenchmarking, "2001:2::/48"),
		rules(ClassIETFProtocol, "2001::/23"),
		rules(ClassDocumentation, "2001:db8::/32", "3fff::/20"),
		rules(Class6to4, "2002::/16"),
		rules(ClassReserved, "5f00::/16"),
		rules(ClassPrivate, "fc00::/7"),
		rules(ClassLinkLocal, "fe80::/10"),
		rules(ClassSiteLocal, "fec0::/10"),
		rules(ClassMulticast, "ff00::/8"),
	)
	// globalUnicast6 is the only IPv6 space IANA has allocated for global
	// unicast; everything outside it (and not matched above) is reserved.
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
)

// Classify reports why a is a special-purpose address, or "" if it is an
// ordinary public unicast address that the proxy may dial. The result is one
// of the Class* constants.
//
// Classify strips any IPv6 zone first and tests explicit prefix lists taken
// from the IANA special-purpose registries, the IPv6 transition mechanisms
// that embed IPv4 addresses, and known cloud metadata addresses; it does not
// rely on [netip.Addr.IsGlobalUnicast] or [netip.Addr.IsPrivate], which call
// many of these ranges global.
//
// An IPv4-mapped address (::ffff:a.b.c.d) is unmapped first and has the
// class of the IPv4 address it carries, because that is where a dial to it
// goes: ::ffff:127.0.0.1 is loopback, ::ffff:0.0.0.0 unspecified. (A
// netip.Prefix never matches a mapped address against an IPv4 prefix, so
// skipping this step would miss them all.) The other IPv4 embeddings (NAT64,
// 6to4, Teredo, IPv4-compatible, IPv4-translated) are classified by their
// prefix, whatever address they embed, public ones included: they are
// refused whole.
func Classify(a netip.Addr) string {
	if !a.IsValid() {
		return ClassInvalid
	}
	a = a.Unmap().WithZone("")
	table := ipv6Rules
	if a.Is4() {
		table = ipv4Rules
	}
	for _, r := range table {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	if a.Is6() && !globalUnicast6.Contains(a) {
		return ClassReserved
	}
	return ""
}

// unlockedByAllowPrivate reports whether Config.AllowPrivate lets a name
// resolve to an address of this class. Only loopback, private (RFC 1918 and
// IPv6 unique-local) and CGNAT addresses are unlocked: they are where test
// servers and intranets live. Metadata, link-local, unspecified, multicast,
// broadcast, reserved and the IPv4-embedding prefixes stay refused.
func unlockedByAllowPrivate(class string) bool {
	switch class {
	case ClassLoopback, ClassPrivate, ClassCGNAT:
		return true
	}
	return false
}
