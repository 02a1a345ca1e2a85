package offline

import (
	"crypto/sha256"
	"encoding/json"
	"strings"
	"sync"
)

// WithPromptCache makes the server count cached input as a provider's prefix cache would, instead of "every
// message but the last" (see "Usage" in the package doc): cached_tokens is the longest prefix of whole messages
// (the offered tools' names, then the messages from the system message on, each re-encoded) that an earlier
// request with the same prompt_cache_key sent, counted as prompt_tokens counts. Chat Completions and Responses
// only. The benchmark of cache-stable pruning reads it (lib/transcript BenchmarkPromptCache).
func WithPromptCache() Option {
	return func(s *Server) { s.cache = &promptCache{seen: map[[32]byte]bool{}} }
}

// maxCachedPrefixes bounds what the simulated cache remembers (one hash per prefix): past it, it starts empty.
const maxCachedPrefixes = 1 << 20

// promptCache remembers the hash of every prefix of whole messages it was sent, by cache key.
type promptCache struct {
	mu   sync.Mutex
	seen map[[32]byte]bool
}

// cached counts the tokens of the longest prefix of msgs an earlier request with key sent, and remembers this
// request's prefixes.
func (c *promptCache) cached(key string, tools []string, msgs []wireMessage) int64 {
	h := sha256.New()
	b, _ := json.Marshal([]string{key, strings.Join(tools, "\x00")})
	h.Write(b)
	sums := make([][32]byte, len(msgs))
	for i, m := range msgs {
		b, _ := json.Marshal(m)
		h.Write(b)
		h.Write([]byte{'\n'})
		copy(sums[i][:], h.Sum(nil))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var cached, tokens int64
	for i, m := range msgs {
		tokens += messageTokens(m)
		if c.seen[sums[i]] {
			cached = tokens // every shorter prefix was remembered with this one
		}
	}
	if len(c.seen)+len(sums) > maxCachedPrefixes {
		clear(c.seen)
	}
	for _, s := range sums {
		c.seen[s] = true
	}
	return cached
}
