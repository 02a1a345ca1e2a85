package offline

import (
	"strings"
	"testing"
)

// WithPromptCache counts as cached the longest prefix of whole messages an earlier request with the same
// prompt_cache_key sent: a request that extends the previous one reads all of it, a changed message ends the
// match, and another key shares nothing.
func TestPromptCache(t *testing.T) {
	t.Parallel()
	base, stop, err := Start("127.0.0.1:0", WithClock(fixedClock{}), WithPromptCache())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	keyed := func(key string, msgs ...object) object {
		body := request(false, msgs...)
		body["prompt_cache_key"] = key
		return body
	}
	// system 1+3, user 1+1 = 6; assistant 1+2, user 1+2 = 6 more.
	first := []object{system("be very brief"), user("hi")}
	longer := append(append([]object(nil), first...), assistant("hello there"), user("how are"))
	for _, tc := range []struct {
		name   string
		body   object
		cached int64
	}{
		{"cold", keyed("th-1", first...), 0},
		{"the same again", keyed("th-1", first...), 6},
		{"extends the previous request", keyed("th-1", longer...), 6},
		{"extends it again", keyed("th-1", append(longer, assistant("fine"), user("good"))...), 12},
		{"another key", keyed("th-2", longer...), 0},
		{"a changed message ends the match", keyed("th-1", system("be very brief"), user("ho"), assistant("hello there"), user("how are")), 4},
	} {
		got := complete(t, strings.TrimSuffix(base, "/"), tc.body)
		if got.Usage.PromptTokensDetails.CachedTokens != tc.cached {
			t.Fatalf("%s: cached %d (prompt %d), want %d", tc.name, got.Usage.PromptTokensDetails.CachedTokens, got.Usage.PromptTokens, tc.cached)
		}
	}
}
