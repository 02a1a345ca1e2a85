package segments_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/uistream"
)

// A handler streams a reply to its client while the same frames are persisted as stream segments for resume.
func Example() {
	ctx := context.Background()
	var persisted []agent.Segment
	seg, err := segments.NewSegmenter(context.WithoutCancel(ctx), segments.SegmenterConfig{
		ThreadID: "th_1",
		RunID:    "run_1",
		Clock:    agent.SystemClock{},
		// In the engine: store.AppendSegment.
		Write: func(_ context.Context, s agent.Segment) error {
			persisted = append(persisted, s)
			return nil
		},
	})
	if err != nil {
		panic(err)
	}

	w := httptest.NewRecorder()
	uistream.SetHeaders(w.Header())
	enc := uistream.NewEncoder(w, seg)
	for _, c := range []uistream.Chunk{
		uistream.Start{MessageID: "msg_1"},
		uistream.StartStep{},
		uistream.TextStart{ID: "t0"},
		uistream.TextDelta{ID: "t0", Delta: "Hello"},
		uistream.TextEnd{ID: "t0"},
		uistream.FinishStep{},
		uistream.Finish{FinishReason: agent.FinishStop},
	} {
		if err := enc.Encode(c); err != nil {
			panic(err)
		}
	}
	enc.Done()
	if err := seg.Close(ctx); err != nil { // writes the final segment
		panic(err)
	}

	fmt.Print(w.Body.String())
	var replay []byte
	for _, s := range persisted {
		replay = append(replay, s.Data...)
	}
	fmt.Println("last segment final:", persisted[len(persisted)-1].Final, "replay identical:", bytes.Equal(replay, w.Body.Bytes()))
	// Output:
	// data: {"type":"start","messageId":"msg_1"}
	//
	// data: {"type":"start-step"}
	//
	// data: {"type":"text-start","id":"t0"}
	//
	// data: {"type":"text-delta","id":"t0","delta":"Hello"}
	//
	// data: {"type":"text-end","id":"t0"}
	//
	// data: {"type":"finish-step"}
	//
	// data: {"type":"finish","finishReason":"stop"}
	//
	// data: [DONE]
	//
	// last segment final: true replay identical: true
}
