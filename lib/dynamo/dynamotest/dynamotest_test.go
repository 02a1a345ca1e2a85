package dynamotest

import (
	"context"
	"strings"
	"testing"
)

// Without Java, Launch reports why instead of hanging or silently passing, and Start turns that into a skip only
// when SkipEnv asks for it. (Not parallel: it changes PATH for the process.)
func TestWithoutJava(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("JAVA_HOME", "")
	t.Setenv(EndpointEnv, "")
	// With the npm package installed the missing piece is Java; on a fresh clone it is npm first.
	_, err := Launch(context.Background())
	if err == nil || !(strings.Contains(err.Error(), "Java") || strings.Contains(err.Error(), "npm")) {
		t.Fatalf("Launch without java: %v, want an error naming Java or npm", err)
	}

	t.Setenv(SkipEnv, "1")
	reached := false
	ok := t.Run("Start", func(t *testing.T) {
		Start(t)
		reached = true
	})
	if !ok || reached {
		t.Fatalf("Start without java and %s=1: passed=%v reached=%v, want a skip", SkipEnv, ok, reached)
	}
}

// EndpointEnv short-circuits the launch.
func TestEndpointOverride(t *testing.T) {
	t.Setenv(EndpointEnv, "http://127.0.0.1:9")
	s, err := Launch(context.Background())
	if err != nil || s.Endpoint != "http://127.0.0.1:9" {
		t.Fatalf("Launch with %s: %+v, %v", EndpointEnv, s, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
