package testenv

import "testing"

func TestTailBufferKeepsTheEnd(t *testing.T) {
	t.Parallel()
	b := &TailBuffer{Max: 8}
	for _, s := range []string{"abc", "defgh", "ijkl"} {
		if _, err := b.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.String(); got != "efghijkl" {
		t.Fatalf("tail = %q, want the last 8 bytes", got)
	}
}
