package modelfiles

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"syscall"
	"time"
)

// publicClient is the default Config.Client: it dials public unicast addresses only (not loopback, private,
// link-local or unspecified ones), checked on the address actually dialled, after DNS, so a name that resolves
// inside the network is refused too. It connects directly, never through HTTPS_PROXY (whose own address would be
// checked instead of the file host's).
var publicClient = &http.Client{Transport: &http.Transport{
	DialContext:         (&net.Dialer{Timeout: 10 * time.Second, Control: publicOnly}).DialContext,
	TLSHandshakeTimeout: 10 * time.Second,
	ForceAttemptHTTP2:   true,
}}

func publicOnly(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return err
	}
	ip = ip.Unmap()
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsMulticast() ||
		slices.ContainsFunc(deniedPrefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) {
		return fmt.Errorf("refusing to download from %s: not a public address", ip)
	}
	return nil
}

// deniedPrefixes are the special-purpose ranges (RFC 6890 and later) that netip's predicates do not name but
// that reach inside networks or nowhere public: "this network", shared address space (carrier-grade NAT, also
// used inside clouds), IETF protocol assignments, documentation, benchmarking, reserved; NAT64 and 6to4 (which
// embed an IPv4 address of any kind), discard, documentation.
var deniedPrefixes = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16",
		"100::/64", "2001:db8::/32"} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()
