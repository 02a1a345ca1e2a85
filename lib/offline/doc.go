// Package offline is a scripted, OpenAI-compatible Chat Completions endpoint served in-process. It lets the
// production openai adapter run end to end in tests and in `agentloop dev` with no API key, and with no network but
// for the images a request names by URL (see "Validation"):
// point the adapter's Config.BaseURL (lib/openai) at the base URL that Start returns (".../v1/").
//
// # Routes
//
//	POST /v1/chat/completions   stream=true (SSE chunks, then "data: [DONE]") or stream=false (one JSON body)
//	POST /v1/responses          the Responses API (stream=true: its SSE events; stream=false: the response
//	                            object), the same script, OpenAI's refusals: see responses.go
//	POST /v1/messages           Anthropic's Messages API, stream=true (SSE events) or not: the same script,
//	                            validated and answered as Anthropic does (messages.go)
//	POST /model/{id}/invoke-with-response-stream, /model/{id}/invoke
//	                            Bedrock's InvokeModel for Anthropic models: the same Messages answers in
//	                            AWS's event-stream framing, Bedrock's errors (messages.go)
//	POST /model/{id}/converse-stream
//	                            Bedrock's ConverseStream: the same script as its event stream (SigV4 header
//	                            required, not verified), validated and refused as Bedrock does, the model id
//	                            reported by /model (converse.go)
//	POST /v1/embeddings         {model, input: a string or an array of strings}: deterministic vectors of
//	                            EmbeddingDims (Embedding: each word's concept hashed into a signed bucket, the
//	                            sum normalised; a small synonym table gives "remove" and "erase" the concept of
//	                            "delete", "forecast" that of "weather", and so on, for the tool router's tests)
//	GET  /v1/models             one model, "offline"
//
// The "/v1" prefix is optional. The API key is ignored. Errors use OpenAI's body shape
// {"error":{"message","type","param","code"}} (param and code null when they name nothing).
//
// # Validation (as the provider does)
//
// Every chat completion request is checked before it is answered, and an invalid one is answered 400 with
// type "invalid_request_error" and OpenAI's own message, param and code for the case (so a test that sees this
// answer would have seen the same one from OpenAI; DESIGN principle 5). In the order they are checked:
//
//	the body          is a JSON object
//	model             present, a non-empty string ("you must provide a model parameter")
//	messages          present, an array, not empty
//	each message      an object with a known role: system, developer, user, assistant, tool (not the deprecated
//	                  "function"); content a string or an array of parts: text, image_url or file for user,
//	                  text (and refusal for assistant) for the others, each part carrying its payload field;
//	                  image_url.url an http(s) URL or a base64 data URL of image/png, jpeg, gif or webp;
//	                  file.file_id, or file.file_data a base64 data URL of application/pdf (data URLs with
//	                  at least one byte: "Invalid image URL: …" / "Invalid file data: …", code invalid_value);
//	                  content required except on an assistant message with tool_calls; an assistant message
//	                  with neither is refused; tool_calls entries have an id, type "function", a function name
//	                  and string arguments; a tool message has a tool_call_id
//	tools             when present: a non-empty array of {type: "function", function: {name, parameters?}},
//	                  name matching ^[a-zA-Z0-9_-]+$ and at most 64 characters, parameters an object
//	the transcript    an assistant message with tool_calls is followed, before any other role, by tool
//	                  messages answering each of its ids (in any order); a tool message answers a call of the
//	                  assistant message right before its run of tool messages ("messages with role 'tool' must
//	                  be a response to a preceeding message with 'tool_calls'", OpenAI's spelling)
//	images by URL     every user message's image_url with an http(s) URL is downloaded (WithFileClient, within
//	                  DefaultFileTimeout), as OpenAI downloads it: one that cannot be (an error status, such as an
//	                  expired pre-signed URL's 404, or no answer) gets OpenAI's "Error while downloading URL."
//	                  (or "Timeout while downloading URL."), code invalid_image_url; one whose bytes are no PNG,
//	                  JPEG, GIF or WebP gets "You uploaded an unsupported image. …", code invalid_image_format;
//	                  param null. These are the only requests that reach the network.
//	the context      the messages fit the context window (WithContextTokens, default DefaultContextTokens), counted
//	                 as chars/4 of their text, tool call ids, names and arguments (files not counted); a longer
//	                 request gets OpenAI's "This model's maximum context length is N tokens. However, your
//	                 messages resulted in M tokens. …", param "messages", code context_length_exceeded
//
// # Behaviour (a public contract: engine and end-to-end tests rely on it)
//
// The model answers the text of the newest user message in the request (its "turn"); everything after that
// message (assistant tool calls, tool results) is the turn's progress. Commands are the first word of that text:
//
//	/tool NAME {json}     Calls tool NAME with the JSON object as arguments ("{}" when omitted). The arguments
//	                      are streamed in a few delta chunks and the reply ends with finish_reason "tool_calls".
//	                      Several "/tool NAME {json}" in one message make parallel calls in one reply. Once the
//	                      turn holds tool results (role "tool" messages after the newest user message), the reply
//	                      is one line per result of the newest tool-call round: "Tool NAME returned: OUTPUT".
//	                      Arguments that are not a JSON object get a plain-text usage answer instead.
//	/loop NAME {json}     Like /tool but calls the tool again on every request, whatever results the turn holds:
//	                      it never ends a turn by itself (for step-limit tests).
//	/slow N               Streams N words ("word1 word2 ..."), waiting the word delay (default 100 ms) before each.
//	                      A cancelled request stops at once.
//	/error STATUS         Every request of the turn fails with HTTP STATUS (400-599) before any output.
//	/error STATUS after N Streams N words, then sends an in-band error event (data: {"error":{...}}, code STATUS)
//	                      and ends the stream without finish_reason or [DONE] — a provider failure mid-stream.
//	                      Non-streaming requests fail with STATUS at once.
//	/drop N               Streams N words, then cuts the connection (no error event, no [DONE]) — a network
//	                      failure mid-stream. Non-streaming requests are cut before any response.
//	/flaky K STATUS REST  The first K requests of the turn fail with HTTP STATUS; later ones answer REST as if
//	                      it were the whole message (or echo the whole text when REST is empty). Requests are
//	                      counted per turn, keyed by the transcript up to and including the newest user message,
//	                      so a retried request counts and the tool-result request of a /tool turn succeeds.
//	/think REST           Streams a reasoning delta (delta.reasoning_content, as DeepSeek and vLLM do), then
//	                      answers REST as if it were the whole message.
//	/received             Replies with one line per content part of the newest user message, in order: "text",
//	                      "image_url image/png 68 bytes" (a data URL: its media type and decoded size),
//	                      "image_url https://…" (a URL, as sent), "file application/pdf report.pdf 1234 bytes"
//	                      (file_data; "-" for no filename) or "file <file_id>". A string content is "text".
//	/tools                Replies with the names of the tools the request offered, one per line, in the request's
//	                      order ("No tools were offered." when none): what a router chose is visible from outside.
//	Title this conversation.
//	                      (lib/titles' title request, recognised by its first sentence) Answers a deterministic
//	                      title: the first six words of the text between <user> and </user> (the thread's first
//	                      user message), the first letter upper case; "Untitled conversation" when it is empty.
//	anything else         Streams "You said: <text>" word by word.
//
// A request with no user message is answered with a fixed sentence. When max_completion_tokens (or max_tokens)
// is smaller than the reply's word count, the text is cut to that many words and finish_reason is "length".
// Tool call ids and completion ids are derived from the request's messages, so a retried request gets the same
// ids and different turns get different ones.
//
// # Usage
//
// Every reply reports usage (non-streaming: always; streaming: as a final chunk with empty choices when
// stream_options.include_usage is true). Tokens are a deterministic estimate: one per whitespace-separated word,
// plus one per message and one per tool call. prompt_tokens counts the request's messages (text and tool-call
// arguments); completion_tokens counts the reply's reasoning, text and tool calls; total_tokens is their sum;
// prompt_tokens_details.cached_tokens counts every message but the last, as if the provider had cached the
// previous request's prefix (WithPromptCache counts instead the longest prefix of whole messages an earlier request
// with the same prompt_cache_key sent, as a provider's prefix cache does); completion_tokens_details.reasoning_tokens (sent only when the reply reasons, as
// /think does) counts the reasoning's words, which are part of completion_tokens. The reply's model echoes the request's model.
package offline
