// Package netproxy is an in-process HTTP CONNECT egress proxy with a host
// allowlist. It gives a sandbox a single, narrow way out to the network: an
// HTTPS tunnel to a host:port the operator listed, reached only at a public
// address the proxy resolved and checked itself.
//
// The package knows nothing of what it serves. The caller opens one listener
// per sandbox (for a container, on the gateway of the sandbox's internal
// network) and calls [Proxy.Serve] with the sandbox id; each listener gets its
// own limits and log fields.
//
// # What happens to a request
//
// Each client connection carries one request: a refusal is sent with
// "Connection: close", and a tunnel owns its connection until it ends. The
// proxy reads the request line and header itself (net/textproto), within
// Config.HeaderTimeout (408) and Config.MaxHeaderBytes (431), and then:
//
//  1. applies the sandbox's request rate (429 with Retry-After);
//  2. refuses every method but CONNECT with 405. Plain-HTTP proxying
//     (absolute-form "GET http://host/") and origin-form requests are never
//     forwarded: there is one decision path, for CONNECT, and clients must
//     use https:// URLs;
//  3. accepts only a strict authority-form target "host:port" (the request
//     target alone decides; the Host header is ignored), with a canonical
//     decimal port and no body (400 otherwise);
//  4. refuses IP-literal targets (403): the allowlist holds names only, so
//     "CONNECT 8.8.8.8:443" or "[::1]:443" never matches anything. Hosts that
//     are not ASCII, or whose last label is a number ("2130706433",
//     "0x7f.1", "127.1"), are refused with 400 before any lookup;
//  5. matches the normalised name and port against the [Allowlist] (403);
//  6. takes one of the sandbox's tunnel slots (429 with Retry-After);
//  7. resolves the name once, with Config.DNSTimeout, through Config.Resolver
//     (502 on failure), and checks every answer with [Classify], the proxy's
//     own listener addresses and Config.DenyAddrs. Mixed answers are refused
//     whole (403): the proxy never picks the good half of an answer that also
//     points somewhere it must not go;
//  8. dials the first answer, exactly that IP literal, with
//     Config.ConnectTimeout (504 on timeout, 502 on error), and nothing else:
//     there is no fallback to other addresses. The default dialer checks the
//     address again in net.Dialer.Control, just before connect(2);
//  9. for a host some secret is for (Config.Secrets), opens TLS to it and
//     verifies its certificate and name (502 on failure); see Interception;
//  10. answers 200. A tunnel that is not intercepted must open with a TLS
//     ClientHello naming the CONNECT target, or none, or not be TLS at all.
//     The proxy waits for the first byte from either side (within the
//     tunnel's idle time): an upstream that speaks first, or a client
//     whose first byte does not start a TLS handshake record, passes
//     unchecked. Otherwise the whole ClientHello (at most 64 KiB) must
//     arrive within Config.HeaderTimeout of its first byte, and is checked
//     before a byte of it is passed on: another name is refused (403 in the
//     Decision; the client, which has its 200, gets a TLS access_denied
//     alert), and so is a hello that is malformed, cut short, late (408) or
//     interrupted by the upstream. A partial hello never passes. The bytes
//     read are passed on;
//  11. copies bytes both ways until both sides have finished (half-closes
//     are passed on), nothing has moved for Config.IdleTimeout,
//     Config.MaxLifetime has passed, or Serve's context ends.
//
// The allowed Decision of a plain tunnel is recorded once its first bytes
// are checked (at once for a TLS client); that of an intercepted one when
// the real host is verified.
//
// # Interception
//
// With Config.Secrets, New makes a CA (ECDSA P-256) in memory; [Proxy.CACert]
// is its certificate for the sandbox to trust, and [Proxy.SecretEnv] each
// secret's placeholder for one sandbox. A tunnel to a secret's host is
// terminated here: the proxy opens TLS to the real host over the checked
// connection, verifying its certificate and name against Config.RootCAs,
// answers 200, and serves the sandbox's TLS (only http/1.1) with a leaf
// certificate for the host, minted on first use, cached and valid a day.
// Each HTTP/1.1 request goes on to the real host (net/http's reverse
// proxy: keep-alive, bodies streamed, 1xx passed on; protocol upgrades
// refused) with the sandbox's placeholders for that host's secrets
// replaced by their values where a credential belongs: the Authorization
// header (Basic credentials decoded and encoded again) and the header
// fields of [Secret.Headers]; the path and query only for a secret with
// [Secret.InURL]. Placeholders anywhere else, and those of other sandboxes
// or hosts, are left alone; request bodies are not rewritten. The request
// asks for an uncompressed, whole response (Accept-Encoding: identity, no
// Range). Everything the host answers has each value, literal or percent-,
// JSON- or HTML-escaped or in base64 (Basic credentials included), turned
// back into the placeholder: 1xx headers, the header, the body as it
// streams (a gzip or deflate body decoded first; any other coding is a
// 502) and the trailer. The first use of each secret on a tunnel is logged
// ("proxy secret used") and passed to Config.OnSecretUse; a value is never
// logged, and errors are scrubbed of values before they are logged or sent.
//
// Every refusal is an HTTP error whose text/plain body and [ErrorHeader]
// header carry the same sentence, which says what to do next. Every allowed
// request produces exactly one [Decision] (logged as "proxy decision" and
// passed to Config.OnDecision) and every tunnel exactly one [Close] ("proxy
// tunnel closed", Config.OnClose). Refusals are aggregated per sandbox, so
// that a sandbox cannot grow the logs without bound: in each
// Config.RefusalInterval the first refusal of each kind (host, port, status
// and reason) is a Decision of its own, its repeats are counted into one
// summary Decision when the interval ends, and past Config.MaxRefusalKinds
// kinds the rest are counted into one more. The allowed requests are bounded
// by the sandbox's request rate. Request headers, Proxy-Authorization
// included, are never logged.
//
// A listener can be reserved for its sandbox's address (Serve's clients):
// connections from any other address are refused before their request is
// read.
//
// # Limits of the model
//
// A program that ignores HTTPS_PROXY simply cannot connect: with the
// sandbox on an internal network the proxy is the only route out, so direct
// connections fail (the network setup, not this package, guarantees that).
// Plain-HTTP URLs fail with 405 and a sentence saying to use https.
//
// DNS is the proxy's job: the sandbox needs no resolver and should have none
// (a resolver that forwards queries is an exfiltration channel). A name with
// a dot is looked up fully qualified ("api.example.com."), so resolv.conf
// search domains never turn it into another name; a single-label name such
// as "localhost" is looked up as given. The default resolver is Go's own,
// which does not read numeric names as addresses. An IPv4-mapped answer
// (::ffff:a.b.c.d) is checked and dialled as the IPv4 address it carries.
//
// Apart from the ClientHello, the proxy does not look inside a tunnel that
// is not intercepted. A client can send no SNI, or a non-TLS protocol, to an
// allowed host:port, and Encrypted Client Hello hides the inner name; a CDN
// that routes on the Host header alone can still be fronted through. Allow
// names whose servers you trust not to relay for others. A second CONNECT
// sent inside a tunnel reaches the allowed upstream, not this proxy.
//
// Address classes unlocked by Config.AllowPrivate are loopback, private and
// CGNAT only; see [Classify] and Config.AllowPrivate.
package netproxy
