package testenv

import (
	"bytes"
	"sync"
)

// TailBuffer keeps the last Max bytes written to it: a child process's output, for error reports.
type TailBuffer struct {
	Max int

	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *TailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if extra := b.buf.Len() - b.Max; b.Max > 0 && extra > 0 {
		b.buf.Next(extra)
	}
	return len(p), nil
}

func (b *TailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
