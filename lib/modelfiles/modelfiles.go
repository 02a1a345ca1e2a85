// Package modelfiles decides what the files of a model request become, for the adapters whose providers take
// files as data URLs or URLs (lib/openai, lib/openairesponses): which are downloaded, within which bounds, and which
// go as a line in their place. Each adapter then writes the result in its own wire's content parts.
//
// Resolve works through the user messages newest first. A PDF named by an https URL is downloaded (the providers
// take PDFs as data), and so is an older message's image named by one (the provider would fetch it on every later
// turn, and refuse every later request once it is gone: an expired pre-signed URL); the newest user message's
// images by URL go as they are (the provider fetches them, and refuses the request when it cannot: the person's
// own error). Downloads are https only (redirects too), Config.MaxFileBytes at most, within Config.Timeout, with
// Config.Client (by default one that dials public addresses only), and their bytes must be what the provider
// decodes (agent.CheckModelFile: a PDF's header; a PNG, JPEG, GIF or WebP image, sent as the type its bytes are).
// A download of the newest user message's file that fails fails the request (KindUnavailable, CodeModelError);
// an older message's that fails becomes the line "[attachment NAME (TYPE) no longer available]" (REVIEW S4). The
// files of one request carry Config.MaxRequestBytes at most (decoded): the newest kept first, older ones beyond it
// a line; the newest message's own files over it fail the request (KindTooLarge, CodeMessageTooLarge). The data
// URLs of recent downloads are kept (twice MaxFileBytes of them at most, for CacheTTL), so that a run's later
// steps, which send the same history, do not download again.
package modelfiles

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults for the zero values of Config.
const (
	// DefaultMaxFileBytes bounds a file the adapter downloads.
	DefaultMaxFileBytes = 20 << 20
	// DefaultTimeout bounds one such download.
	DefaultTimeout = 30 * time.Second
	// DefaultMaxRequestBytes bounds the files of one request, decoded, data URLs and downloads alike (providers
	// refuse about 50 MB; a Lambda holds them all at once, as base64).
	DefaultMaxRequestBytes = 32 << 20
)

// CacheTTL is how long a downloaded file is reused: a run's steps, not a copy of the remote file.
const CacheTTL = 10 * time.Minute

// Config configures a Resolver. Zero values take the defaults above.
type Config struct {
	// Client downloads the files (default: one that dials public addresses only, so a user cannot make the server fetch from its own
	// network; tests inject an httptest TLS server's client). It follows redirects to https URLs only.
	Client *http.Client
	// MaxFileBytes and Timeout bound each download; MaxRequestBytes the files of one request.
	MaxFileBytes    int64
	Timeout         time.Duration
	MaxRequestBytes int64
	// Logger receives a warning per older file that is not available (default slog.Default()).
	Logger *slog.Logger
}

// Resolver resolves the files of requests. It is safe for concurrent use.
type Resolver struct {
	cfg   Config
	cache cache // files downloaded for recent requests: a run's steps send the same history again
}

// New returns a Resolver for cfg.
func New(cfg Config) *Resolver {
	if cfg.Client == nil {
		cfg.Client = publicClient
	}
	cfg.Client = httpsRedirects(cfg.Client)
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Resolver{cfg: cfg, cache: cache{max: 2 * cfg.MaxFileBytes}}
}

// Sent is what one file of a request becomes: the URL the provider gets (the newest message's image's as it is,
// any other file's data URL), or a line (Stub) in its place saying why it is not sent.
type Sent struct{ URL, Stub string }

// Resolve decides, newest message first, what each user file of msgs becomes (indexed by message, then file).
// downloaded has the decoded size of each PDF downloaded, by URL (agent.ModelResult.FileBytes).
func (r *Resolver) Resolve(ctx context.Context, msgs []agent.ModelMessage) (files map[int][]Sent, downloaded map[string]int64, err error) {
	newest := -1
	for i, msg := range msgs {
		if msg.Role == "user" {
			newest = i
		}
	}
	out := map[int][]Sent{}
	var total int64
	for i := len(msgs) - 1; i >= 0; i-- {
		msg := msgs[i]
		if msg.Role != "user" || len(msg.Files) == 0 {
			continue
		}
		sent := make([]Sent, len(msg.Files))
		for j, f := range msg.Files {
			u := f.URL
			image := strings.HasPrefix(f.MediaType, "image/")
			if !strings.HasPrefix(u, "data:") && (!image || i != newest) {
				var err error
				if u, err = r.download(ctx, f); err != nil {
					if i == newest || ctx.Err() != nil {
						return nil, nil, err
					}
					r.cfg.Logger.WarnContext(ctx, "an older message's file is not available", "url", SafeURL(f.URL), "err", err)
					sent[j].Stub = fileLine(f, "no longer available")
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
			if total+n > r.cfg.MaxRequestBytes {
				if i == newest {
					return nil, nil, agent.E(agent.KindTooLarge, agent.CodeMessageTooLarge,
						"the message's files are over %d bytes in all", r.cfg.MaxRequestBytes)
				}
				sent[j].Stub = fileLine(f, fmt.Sprintf("not shown: the request's files are over %d bytes", r.cfg.MaxRequestBytes))
				continue
			}
			total += n
			sent[j].URL = u
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

// cache keeps the data URLs of recent downloads, newest last, max bytes of them at most.
type cache struct {
	mu      sync.Mutex
	max     int64
	bytes   int64
	entries []cachedFile
}

type cachedFile struct {
	url, mediaType, data string
	at                   time.Time
}

func (c *cache) get(url, mediaType string, now time.Time) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.url == url && e.mediaType == mediaType && now.Sub(e.at) < CacheTTL {
			return e.data, true
		}
	}
	return "", false
}

func (c *cache) put(url, mediaType, data string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, cachedFile{url: url, mediaType: mediaType, data: data, at: now})
	c.bytes += int64(len(data))
	for len(c.entries) > 0 && (c.bytes > c.max || now.Sub(c.entries[0].at) >= CacheTTL) {
		c.bytes -= int64(len(c.entries[0].data))
		c.entries = c.entries[1:]
	}
}

// download fetches f's https URL and returns it as a data URL (a recent download's again): a PDF's of its media
// type, an image's of the type its bytes are (a host may label a PNG image/jpeg; the provider reads the bytes).
func (r *Resolver) download(ctx context.Context, f agent.ModelFile) (string, error) {
	if data, ok := r.cache.get(f.URL, f.MediaType, time.Now()); ok {
		return data, nil
	}
	data, err := r.fetch(ctx, f)
	if err == nil {
		r.cache.put(f.URL, f.MediaType, data, time.Now())
	}
	return data, err
}

func (r *Resolver) fetch(ctx context.Context, f agent.ModelFile) (string, error) {
	fail := func(err error, msg string, args ...any) error {
		return agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, fmt.Sprintf(msg, args...))
	}
	u, err := url.Parse(f.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fail(err, "a file is neither a data URL nor an https URL")
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.URL, nil)
	if err != nil {
		return "", fail(err, "a file's URL cannot be fetched")
	}
	res, err := r.cfg.Client.Do(req)
	if err != nil {
		// The cause names the host, never the query (a pre-signed URL's is a credential); the message neither.
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = SafeURL(ue.URL)
		}
		return "", fail(err, "a file could not be downloaded")
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return "", fail(fmt.Errorf("GET %s: %s", SafeURL(f.URL), res.Status), "a file could not be downloaded (HTTP %d)", res.StatusCode)
	}
	image := strings.HasPrefix(f.MediaType, "image/")
	if ct, _, err := mime.ParseMediaType(res.Header.Get("Content-Type")); err == nil && ct != f.MediaType &&
		ct != "application/octet-stream" && ct != "binary/octet-stream" && !(image && strings.HasPrefix(ct, "image/")) {
		return "", fail(fmt.Errorf("GET %s: content type %s", SafeURL(f.URL), ct), "a file's download is %s, not %s", ct, f.MediaType)
	}
	max := r.cfg.MaxFileBytes
	data, err := io.ReadAll(io.LimitReader(res.Body, max+1))
	if err == nil {
		// A response that arrived as the deadline passed may be a server's answer to its own cancelled request.
		err = ctx.Err()
	}
	if err != nil {
		return "", fail(err, "a file could not be downloaded")
	}
	if len(data) == 0 {
		return "", fail(fmt.Errorf("GET %s: no bytes", SafeURL(f.URL)), "a file could not be downloaded (no bytes)")
	}
	if int64(len(data)) > max {
		return "", fail(fmt.Errorf("GET %s: over %d bytes", SafeURL(f.URL), max), "a file is larger than %d bytes", max)
	}
	mediaType := f.MediaType
	if image {
		mediaType, _, _ = strings.Cut(http.DetectContentType(data), ";")
	}
	out := "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(data)
	// What the provider could not decode would be refused on every later turn too (REVIEW S4).
	if err := agent.CheckModelFile(mediaType, out); err != nil || (image && !strings.HasPrefix(mediaType, "image/")) {
		return "", fail(fmt.Errorf("GET %s: the bytes are %s", SafeURL(f.URL), mediaType), "a file's download is not an %s file", f.MediaType)
	}
	return out, nil
}

// SafeURL is a URL as logs may show it: scheme, host and path, without user info, query or fragment (a
// pre-signed URL's query is a credential: REVIEW S16).
func SafeURL(raw string) string {
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
