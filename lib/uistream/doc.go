// Package uistream encodes the AI SDK UI message stream, protocol v1: the Server-Sent Events body that the AI
// SDK's `useChat` (DefaultChatTransport) reads. A reply is
//
//	data: {"type":"start","messageId":"..."}\n\n
//	data: {"type":"start-step"}\n\n
//	...
//	data: {"type":"finish","finishReason":"stop","messageMetadata":{...}}\n\n
//	data: [DONE]\n\n
//
// served with the headers SetHeaders writes.
//
// The chunk types are a closed set of structs (Start, TextDelta, ToolInputAvailable, Data, Finish, ...). Each
// emits only the fields that both the ai@6 and the ai@7 client schemas (`uiMessageChunkSchema`) declare, so a
// client on either major reads every field we send; lib/uistream/aisdktest/testdata/checker proves it with the real packages
// (see the aisdktest subpackage).
//
// An Encoder writes every frame to the client and hands the same bytes to a Sink. A client that goes away does
// not stop the encoder: the run goes on and its stream must still be persisted. The Segmenter is the Sink the
// engine uses: it batches frames into numbered stream segments (agent.Segment) and persists them at least every
// DefaultSegmentInterval, at step ends (Flush) and at the end of the run (Close, which writes the Final
// segment), each segment at most DefaultMaxSegmentBytes long.
package uistream
