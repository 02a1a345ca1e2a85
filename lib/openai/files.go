package openai

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	oai "github.com/openai/openai-go/v3"
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
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsMulticast() {
		return fmt.Errorf("refusing to download from %s: not a public address", ip)
	}
	return nil
}

func (m *Model) userParts(ctx context.Context, msg agent.ModelMessage) ([]oai.ChatCompletionContentPartUnionParam, error) {
	var parts []oai.ChatCompletionContentPartUnionParam
	if msg.Text != "" {
		parts = append(parts, oai.TextContentPart(msg.Text))
	}
	for _, f := range msg.Files {
		if strings.HasPrefix(f.MediaType, "image/") {
			parts = append(parts, oai.ImageContentPart(oai.ChatCompletionContentPartImageImageURLParam{URL: f.URL}))
			continue
		}
		data := f.URL
		if !strings.HasPrefix(data, "data:") {
			var err error
			if data, err = m.download(ctx, f); err != nil {
				return nil, err
			}
		}
		name := f.Filename
		if name == "" {
			name = "document.pdf"
		}
		parts = append(parts, oai.FileContentPart(oai.ChatCompletionContentPartFileFileParam{
			FileData: oai.String(data), Filename: oai.String(name)}))
	}
	return parts, nil
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

// download fetches f's https URL and returns it as a data URL of f's media type (a recent download's again).
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
		// The cause names the host; the message does not.
		return "", fail(err, "a file could not be downloaded")
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return "", fail(fmt.Errorf("GET %s: %s", u.Redacted(), res.Status), "a file could not be downloaded (HTTP %d)", res.StatusCode)
	}
	if ct, _, err := mime.ParseMediaType(res.Header.Get("Content-Type")); err == nil && ct != f.MediaType &&
		ct != "application/octet-stream" && ct != "binary/octet-stream" {
		return "", fail(fmt.Errorf("GET %s: content type %s", u.Redacted(), ct), "a file's download is %s, not %s", ct, f.MediaType)
	}
	data, err := io.ReadAll(io.LimitReader(res.Body, m.cfg.MaxFileBytes+1))
	if err != nil {
		return "", fail(err, "a file could not be downloaded")
	}
	if int64(len(data)) > m.cfg.MaxFileBytes {
		return "", fail(fmt.Errorf("GET %s: over %d bytes", u.Redacted(), m.cfg.MaxFileBytes), "a file is larger than %d bytes", m.cfg.MaxFileBytes)
	}
	return "data:" + f.MediaType + ";base64," + base64.StdEncoding.EncodeToString(data), nil
}
