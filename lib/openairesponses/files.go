package openairesponses

// Files: the same policy as package openai's (files.go there, copied rather than shared: adapters do not import
// each other). PDFs named by https URL are downloaded and sent as data (the budget then counts their size:
// ModelResult.FileBytes), and so are older messages' images by URL (an expired pre-signed URL would otherwise fail
// every later turn); the newest message's images by URL go as they are. An older message's file that cannot be
// downloaded, or that would pass Config.MaxRequestFileBytes, is sent as a line saying so.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// publicClient is the default Config.FileClient: it dials public unicast addresses only (not loopback,
// private, link-local or unspecified ones), checked on the address actually dialled, after DNS, so a name
// that resolves inside the network is refused too. It connects directly, never through HTTPS_PROXY (whose own
// address would be checked instead of the file host's).
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

// sentFile is what one file of a request becomes: the URL the provider gets (the newest message's image's as it
// is, any other file's data URL), or a line in its place saying why it is not sent.
type sentFile struct{ url, stub string }

// resolveFiles decides, newest message first, what each user file of msgs becomes (indexed by message, then
// file): PDFs by https URL are downloaded, and so are older messages' images by https URL (the provider would
// fetch them itself, and refuse every later request of the thread once one is gone: an expired pre-signed URL);
// an older message's file that cannot be, or that would pass the request's file bytes, becomes a line; the
// newest user message's fails the request. The newest message's images by URL go as they are: the provider
// fetches them, and refuses the request when it cannot (the person's own error, told as the provider's 400).
// downloaded has the decoded size of each PDF downloaded, by URL (agent.ModelResult.FileBytes).
func (m *Model) resolveFiles(ctx context.Context, msgs []agent.ModelMessage) (files map[int][]sentFile, downloaded map[string]int64, err error) {
	newest := -1
	for i, msg := range msgs {
		if msg.Role == "user" {
			newest = i
		}
	}
	out := map[int][]sentFile{}
	var total int64
	for i := len(msgs) - 1; i >= 0; i-- {
		msg := msgs[i]
		if msg.Role != "user" || len(msg.Files) == 0 {
			continue
		}
		sent := make([]sentFile, len(msg.Files))
		for j, f := range msg.Files {
			u := f.URL
			image := strings.HasPrefix(f.MediaType, "image/")
			if !strings.HasPrefix(u, "data:") && (!image || i != newest) {
				var err error
				if u, err = m.download(ctx, f); err != nil {
					if i == newest || ctx.Err() != nil {
						return nil, nil, err
					}
					m.cfg.Logger.WarnContext(ctx, "an older message's file is not available", "url", safeURL(f.URL), "err", err)
					sent[j].stub = fileLine(f, "no longer available")
					continue
				}
				if !image {
					if downloaded == nil {
						downloaded = map[string]int64{}
					}
					downloaded[f.URL] = dataBytes(u)
				}
			}
			n := dataBytes(u)
			if total+n > m.cfg.MaxRequestFileBytes {
				if i == newest {
					return nil, nil, agent.E(agent.KindTooLarge, agent.CodeMessageTooLarge,
						"the message's files are over %d bytes in all", m.cfg.MaxRequestFileBytes)
				}
				sent[j].stub = fileLine(f, fmt.Sprintf("not shown: the request's files are over %d bytes", m.cfg.MaxRequestFileBytes))
				continue
			}
			total += n
			sent[j].url = u
		}
		out[i] = sent
	}
	return out, downloaded, nil
}

// dataBytes is the decoded size of a data URL's payload (0 for another URL: the provider fetches it).
func dataBytes(u string) int64 {
	if !strings.HasPrefix(u, "data:") {
		return 0
	}
	_, payload, _ := strings.Cut(u, ",")
	return int64(len(payload)) * 3 / 4
}

// fileLine is the line sent in place of a file.
func fileLine(f agent.ModelFile, why string) string {
	name := f.Filename
	if name == "" {
		name = "unnamed"
	}
	return fmt.Sprintf("[attachment %s (%s) %s]", name, f.MediaType, why)
}

// userParts is a user message's content: its text, then each file as the request sends it (an image as
// input_image, a PDF as input_file with its data URL), or the line that stands in for it.
func userParts(msg agent.ModelMessage, files []sentFile) []any {
	parts := make([]any, 0, 1+len(msg.Files))
	if msg.Text != "" || len(msg.Files) == 0 {
		parts = append(parts, textPart{Type: "input_text", Text: msg.Text})
	}
	for j, f := range msg.Files {
		sent := files[j]
		switch {
		case sent.stub != "":
			parts = append(parts, textPart{Type: "input_text", Text: sent.stub})
		case strings.HasPrefix(f.MediaType, "image/"):
			parts = append(parts, imagePart{Type: "input_image", ImageURL: sent.url, Detail: "auto"})
		default:
			name := f.Filename
			if name == "" {
				name = "document.pdf"
			}
			parts = append(parts, filePart{Type: "input_file", Filename: name, FileData: sent.url})
		}
	}
	return parts
}

// fileCacheTTL is how long a downloaded file is reused: a run's steps, not a copy of the remote file.
const fileCacheTTL = 10 * time.Minute

// fileCache keeps the data URLs of recent downloads, newest last, max bytes of them at most.
type fileCache struct {
	mu      sync.Mutex
	max     int64
	bytes   int64
	entries []cachedFile
}

type cachedFile struct {
	url, mediaType, data string
	at                   time.Time
}

func (c *fileCache) get(url, mediaType string, now time.Time) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.url == url && e.mediaType == mediaType && now.Sub(e.at) < fileCacheTTL {
			return e.data, true
		}
	}
	return "", false
}

func (c *fileCache) put(url, mediaType, data string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, cachedFile{url: url, mediaType: mediaType, data: data, at: now})
	c.bytes += int64(len(data))
	for len(c.entries) > 0 && (c.bytes > c.max || now.Sub(c.entries[0].at) >= fileCacheTTL) {
		c.bytes -= int64(len(c.entries[0].data))
		c.entries = c.entries[1:]
	}
}

// download fetches f's https URL and returns it as a data URL (a recent download's again): a PDF's of its media
// type, an image's of the type its bytes are (a host may label a PNG image/jpeg; the provider reads the bytes).
func (m *Model) download(ctx context.Context, f agent.ModelFile) (string, error) {
	if data, ok := m.files.get(f.URL, f.MediaType, time.Now()); ok {
		return data, nil
	}
	data, err := m.fetch(ctx, f)
	if err == nil {
		m.files.put(f.URL, f.MediaType, data, time.Now())
	}
	return data, err
}

func (m *Model) fetch(ctx context.Context, f agent.ModelFile) (string, error) {
	fail := func(err error, msg string, args ...any) error {
		return agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, fmt.Sprintf(msg, args...))
	}
	u, err := url.Parse(f.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fail(err, "a file is neither a data URL nor an https URL")
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.FileTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.URL, nil)
	if err != nil {
		return "", fail(err, "a file's URL cannot be fetched")
	}
	res, err := m.cfg.FileClient.Do(req)
	if err != nil {
		// The cause names the host, never the query (a pre-signed URL's is a credential); the message neither.
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = safeURL(ue.URL)
		}
		return "", fail(err, "a file could not be downloaded")
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return "", fail(fmt.Errorf("GET %s: %s", safeURL(f.URL), res.Status), "a file could not be downloaded (HTTP %d)", res.StatusCode)
	}
	image := strings.HasPrefix(f.MediaType, "image/")
	if ct, _, err := mime.ParseMediaType(res.Header.Get("Content-Type")); err == nil && ct != f.MediaType &&
		ct != "application/octet-stream" && ct != "binary/octet-stream" && !(image && strings.HasPrefix(ct, "image/")) {
		return "", fail(fmt.Errorf("GET %s: content type %s", safeURL(f.URL), ct), "a file's download is %s, not %s", ct, f.MediaType)
	}
	data, err := io.ReadAll(io.LimitReader(res.Body, m.cfg.MaxFileBytes+1))
	if err == nil {
		// A response that arrived as the deadline passed may be a server's answer to its own cancelled request.
		err = ctx.Err()
	}
	if err != nil {
		return "", fail(err, "a file could not be downloaded")
	}
	if len(data) == 0 {
		return "", fail(fmt.Errorf("GET %s: no bytes", safeURL(f.URL)), "a file could not be downloaded (no bytes)")
	}
	if int64(len(data)) > m.cfg.MaxFileBytes {
		return "", fail(fmt.Errorf("GET %s: over %d bytes", safeURL(f.URL), m.cfg.MaxFileBytes), "a file is larger than %d bytes", m.cfg.MaxFileBytes)
	}
	mediaType := f.MediaType
	if image {
		mediaType, _, _ = strings.Cut(http.DetectContentType(data), ";")
	}
	out := "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(data)
	// What the provider could not decode would be refused on every later turn too (REVIEW S4).
	if err := agent.CheckModelFile(mediaType, out); err != nil || (image && !strings.HasPrefix(mediaType, "image/")) {
		return "", fail(fmt.Errorf("GET %s: the bytes are %s", safeURL(f.URL), mediaType), "a file's download is not an %s file", f.MediaType)
	}
	return out, nil
}

// safeURL is a URL as logs may show it: scheme, host and path, without user info, query or fragment (a pre-signed
// URL's query is a credential: REVIEW S16).
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// httpsRedirects returns a copy of c that follows redirects to https URLs only (at most 10, as net/http does).
func httpsRedirects(c *http.Client) *http.Client {
	cp := *c
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != "https" {
			return fmt.Errorf("refusing a redirect to %s: not https", req.URL.Scheme)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &cp
}
